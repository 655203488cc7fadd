#pragma once
// weft::two_level<Intra, Inter>: one group of ranks as two communicators, possibly of two
// transports: Intra joins the ranks of each node, Inter the ranks of the same local index
// across nodes. On GPUs that is the fast path hierarchical<> describes with one transport,
// but with each level on the transport that suits its link: peer loads over NVLink
// (weft::cuda::p2p) inside a node and NCCL over InfiniBand across nodes.
//
//   auto world = weft::cuda::two_level_from_mpi(MPI_COMM_WORLD);          // p2p + NCCL (cuda/two_level_mpi.cuh)
//   weft::all_reduce(world, std::span(d_grad, n));                          // on world.stream()
//   weft::all_reduce<weft::algo::stages<weft::algo::direct, weft::algo::vendor>>(world, std::span(d_grad, n));
//   auto host = weft::make_two_level(local_world);                          // one transport, split by node
//
// all_reduce, by chunks of options::chunk_bytes; m = the fewest ranks on any node, and each
// chunk is cut into m blocks (sizes differ by at most one, the same on every node):
//   reduce     Intra: block j reduced onto local rank j, for j < m (Intra's reduce, root j)
//   all-reduce Inter: local rank j (a "leader") all-reduces block j with the leaders j of the
//              other nodes; only these blocks cross the slow link, 1/m of the data per leader
//   broadcast  Intra: block j broadcast from local rank j
// A node with more than m ranks gives its extra ranks no block: they take part in the reduce
// and the broadcast only, so nodes may hold different numbers of ranks. Chunks are queued as
// a pipeline, chunk k+1's reduce before chunk k's broadcast. On even nodes (L ranks each),
// where IntraAlgo plans reduce_scatter and all_gather, the m reduces of a chunk are one Intra
// reduce_scatter and the m broadcasts one all_gather (chunks a multiple of L elements; the
// last count mod L elements go by blocks as above). On GPUs Intra and Inter run on
// their own streams, ordered by events (Handoff, weft::cuda::stream_handoff), so the inter-node
// all-reduce of one chunk overlaps the intra-node reduce of the next. One node: Intra's
// all-reduce; one rank per node: Inter's.
//
// Every element is reduced at one place by Intra, then by Inter's all-reduce (bitwise equal on
// every leader with weft's plans), then only copied: every rank ends with the same bits.
// op::avg sums and divides once, by the whole group's size (half on the host: scales each input
// by 1/size first and sums, as the plain collectives do). The call's buffers are the
// transports' own (device memory for device transports); the call is queued on Intra's stream
// and returns when queued there, as the transports' calls do.
//
// Algorithms: algo::stages<IntraAlgo, InterAlgo> names each level's (IntraAlgo must plan
// reduce and broadcast: ring, tree, direct, automatic; InterAlgo all_reduce, or vendor for the
// transport's own). The default, stages<>, is automatic at both levels.
//
// broadcast and reduce (root: a world rank) use the same blocks and chunks: broadcast sends
// block j of each chunk across nodes from the root's node's local rank j to the other nodes'
// local ranks j, which spread it on their node; reduce is its mirror image, and on the root's
// node the blocks that did not end on the root are handed to it. On even nodes, where
// IntraAlgo plans all_gather (and, for reduce, reduce_scatter), the spreading is one Intra
// all_gather per chunk instead of m broadcasts, and reduce's m reduces one reduce_scatter.
//
// A Handoff orders the levels (operator()(from, to)) and gives a call what it needs besides the
// transports: scratch<T>(comm, n) (host memory from a pool kept between calls, or stream-ordered
// device memory), copy and copy_rows (std::copy_n, or cudaMemcpyAsync and cudaMemcpy2DAsync on
// comm's stream), and divide (op::avg's last step).
//
// Ranks are numbered as the world they were split from; rank(), size(), node_of() are the
// world's; a node's ranks need not be contiguous. A two_level is not itself split again:
// split the world, then make one from that. Collectives offered: all_reduce, broadcast,
// reduce, reduce_scatter, all_gather and barrier (all_to_all: use a world communicator).
//
// reduce_scatter and all_gather move whole rank blocks: rank block i of a node crosses between
// nodes on the local ranks i mod m, by pieces of up to a chunk. all_gather first gathers each
// node's blocks inside it, then broadcasts every block to the other nodes (Inter) and spreads
// it there (Intra); reduce_scatter reduces each block inside every node onto local rank i mod m
// (Intra), then onto the block's node (Inter's reduce), landing on its rank. Where a node's
// ranks interleave with another's in world order, the data is reordered node-major in scratch.
// Where every node has the same number of ranks L and both levels' algorithms plan the
// collective, each takes two calls instead: reduce_scatter copies the blocks local-major (the
// block of local rank l of node c to place l*N + c), reduce-scatters that inside the node (local
// rank l keeps the node's sums of the N blocks of local index l) and then across nodes (each
// rank its own block); all_gather runs the same steps backwards.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft {

namespace algo {

/// two_level's algorithm: IntraAlgo for the reduce and broadcast inside each node, InterAlgo
/// for the all-reduce (broadcast, reduce) across nodes; reduce_scatter and all_gather run on
/// their reduces and broadcasts (and Intra's all-gather where IntraAlgo plans one), or on even
/// nodes, where both plan them, on one reduce_scatter (all_gather) per level.
template <class IntraAlgo = automatic, class InterAlgo = automatic>
struct stages {
  using intra = IntraAlgo;
  using inter = InterAlgo;
  static constexpr std::string_view name = "stages";
  /// What it needs is what each level's algorithm needs of that level's communicator.
  static constexpr capabilities caps{.serves = every_collective.without(collective::all_to_all),
                                     .messages = false};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }
};

template <class A>
inline constexpr bool is_stages_v = false;
template <class I, class O>
inline constexpr bool is_stages_v<stages<I, O>> = true;

} // namespace algo

namespace detail {

/// Each rank's node as an index among the nodes numbered in the order of their first ranks:
/// split colors (>= 0) that put each node's ranks together.
inline std::vector<int> node_colors(const std::vector<int>& node_of) {
  std::map<int, int> color;  // node id -> its number
  std::vector<int> out;
  out.reserve(node_of.size());
  for (const int n : node_of) out.push_back(color.try_emplace(n, static_cast<int>(color.size())).first->second);
  return out;
}

/// node_colors(node_of)[rank].
inline int node_color(const std::vector<int>& node_of, int rank) {
  return node_colors(node_of)[static_cast<std::size_t>(rank)];
}

/// The operator two_level's stages apply: op::avg sums (the division comes once, at the end).
template <class Op>
using summing_t = std::conditional_t<is_average_v<Op>, op::sum, Op>;

/// Host working memory kept between calls, as a caching allocator keeps device memory: a call's
/// scratch is taken from blocks freed by earlier calls where one is big enough, so large
/// buffers are not mapped and faulted in afresh each call. Held until the two_level goes.
class scratch_pool {
public:
  using block = std::unique_ptr<std::max_align_t[]>;
  struct slab {
    block mem;
    std::size_t bytes = 0;
  };
  /// A block of at least `bytes`: the smallest free one that fits, else a new one.
  slab take(std::size_t bytes) {
    {
      const std::lock_guard lock(m_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
      }
      if (best != free_.end()) {
        slab s = std::move(*best);
        free_.erase(best);
        return s;
      }
    }
    if (bytes > std::numeric_limits<std::size_t>::max() - sizeof(std::max_align_t)) {
      throw error("two_level: working memory of " + std::to_string(bytes) + " bytes");
    }
    const std::size_t units = (bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
    return {std::make_unique_for_overwrite<std::max_align_t[]>(units), units * sizeof(std::max_align_t)};
  }
  void give(slab s) {
    const std::lock_guard lock(m_);
    free_.push_back(std::move(s));
  }

private:
  std::mutex m_;
  std::vector<slab> free_;
};

/// n uninitialized elements of T from a scratch_pool, given back when this goes.
template <class T>
class host_scratch {
public:
  host_scratch(std::shared_ptr<scratch_pool> pool, std::size_t n) : pool_(std::move(pool)) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw error("two_level: working memory of " + std::to_string(n) + " elements");
    }
    if (n != 0) s_ = pool_->take(n * sizeof(T));
  }
  host_scratch(host_scratch&&) noexcept = default;
  host_scratch& operator=(host_scratch&&) = delete;
  host_scratch(const host_scratch&) = delete;
  host_scratch& operator=(const host_scratch&) = delete;
  ~host_scratch() {
    if (s_.mem) pool_->give(std::move(s_));
  }
  [[nodiscard]] T* data() const noexcept { return reinterpret_cast<T*>(s_.mem.get()); }

private:
  std::shared_ptr<scratch_pool> pool_;
  scratch_pool::slab s_;
};

template <class Comm>
void check_two_level_root(const Comm& comm, const char* what, int root) {
  if (root < 0 || root >= comm.size()) {
    throw error(what, comm.rank(), error::unknown,
                "root " + std::to_string(root) + " is not a rank of the two_level's " + std::to_string(comm.size()) +
                    " ranks");
  }
}

} // namespace detail

/// The order between two_level's levels where each call returns only when its work is done
/// (the host transports): nothing to do.
struct host_handoff {
  template <class From, class To>
  void operator()(From&, To&) {}
  /// data /= ranks, on the host (op::avg's last step).
  template <class Comm, class T>
  void divide(Comm&, T* data, std::size_t n, int ranks) {
    detail::divide(data, n, ranks);
  }
  /// n elements of working memory for a call on comm, back in the pool when the call returns;
  /// not zeroed (every use writes before it reads).
  template <class T, class Comm>
  detail::host_scratch<T> scratch(Comm&, std::size_t n) {
    return detail::host_scratch<T>(pool_, n);
  }
  /// dst[0, n) = src[0, n), in order with comm's work (disjoint ranges).
  template <class Comm, class T>
  void copy(Comm&, T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  /// rows x n elements: row i from src + i * src_stride to dst + i * dst_stride (disjoint).
  template <class Comm, class T>
  void copy_rows(Comm&, T* dst, std::size_t dst_stride, const T* src, std::size_t src_stride, std::size_t n,
                 std::size_t rows) {
    for (std::size_t i = 0; i < rows; ++i) std::copy_n(src + i * src_stride, n, dst + i * dst_stride);
  }

private:
  std::shared_ptr<detail::scratch_pool> pool_ = std::make_shared<detail::scratch_pool>();
};

struct two_level_options {
  /// Bytes of each pipelined chunk of an all-reduce (the last may be shorter).
  std::size_t chunk_bytes = std::size_t{4} << 20;
};

namespace detail {
struct two_level_access;
} // namespace detail

template <communicator Intra, communicator Inter = Intra, class Handoff = host_handoff>
class two_level {
public:
  using intra_type = Intra;
  using inter_type = Inter;

  /// `intra`: this rank's node, ranked as the world ranks of that node in order; `inter`: the
  /// ranks of this rank's local index, one per node that has one, ranked in the order of the
  /// nodes' first world ranks; `node_of`: the world's node of each rank; `rank`: this rank in
  /// the world. make_two_level() builds all of it from a world communicator.
  /// `held`: what the communicators borrow (an MPI communicator, say), released after them.
  two_level(Intra intra, Inter inter, std::vector<int> node_of, int rank, two_level_options opt = {},
            Handoff handoff = {}, std::shared_ptr<const void> held = {})
      : held_(std::move(held)), intra_(std::move(intra)), inter_(std::move(inter)), node_of_(std::move(node_of)), rank_(rank), opt_(opt),
        handoff_(std::move(handoff)) {
    const int size = static_cast<int>(node_of_.size());
    if (rank_ < 0 || rank_ >= size) {
      throw error("two_level", rank_, error::unknown,
                  "rank " + std::to_string(rank_) + " outside a world of " + std::to_string(size) + " ranks (node_of)");
    }
    if (opt_.chunk_bytes == 0) throw error("two_level", rank_, error::unknown, "chunk_bytes must be at least 1");
    // Node-major order (nodes numbered by first rank, a node's ranks in world order): each
    // rank's node, its index there, each node's size and first position; where each rank's
    // block sits when every node's blocks are kept together.
    color_of_ = detail::node_colors(node_of_);
    nodes_ = 1 + *std::max_element(color_of_.begin(), color_of_.end());
    node_size_.assign(to_size(nodes_), 0);
    local_of_.resize(to_size(size));
    for (std::size_t r = 0; r < local_of_.size(); ++r) local_of_[r] = node_size_[to_size(color_of_[r])]++;
    node_first_.assign(to_size(nodes_), 0);
    for (std::size_t c = 1; c < node_first_.size(); ++c) node_first_[c] = node_first_[c - 1] + node_size_[c - 1];
    pos_.resize(to_size(size));
    contiguous_ = true;
    for (std::size_t r = 0; r < pos_.size(); ++r) {
      pos_[r] = node_first_[to_size(color_of_[r])] + local_of_[r];
      contiguous_ = contiguous_ && pos_[r] == static_cast<int>(r);
    }
    color_ = color_of_[to_size(rank_)];
    local_ = local_of_[to_size(rank_)];
    leaders_ = *std::min_element(node_size_.begin(), node_size_.end());
    even_ = leaders_ == *std::max_element(node_size_.begin(), node_size_.end());
    const int mine = node_size_[to_size(color_)];
    const auto with_local =
        static_cast<int>(std::count_if(node_size_.begin(), node_size_.end(), [&](int n) { return n > local_; }));
    if (intra_.size() != mine || intra_.rank() != local_) {
      throw error("two_level", rank_, error::unknown,
                  "the intra-node communicator has rank " + std::to_string(intra_.rank()) + " of " +
                      std::to_string(intra_.size()) + ", but node_of puts this rank at local index " +
                      std::to_string(local_) + " of " + std::to_string(mine) + " ranks on its node");
    }
    if (inter_.size() != with_local) {
      throw error("two_level", rank_, error::unknown,
                  "the inter-node communicator has " + std::to_string(inter_.size()) + " ranks, but " +
                      std::to_string(with_local) + " nodes have a rank of local index " + std::to_string(local_));
    }
    int inter_rank = 0;  // nodes before this one (by first rank) with a rank of this local index
    for (int c = 0; c < color_; ++c) inter_rank += node_size_[static_cast<std::size_t>(c)] > local_;
    if (inter_.rank() != inter_rank) {
      throw error("two_level", rank_, error::unknown,
                  "the inter-node communicator has this rank at " + std::to_string(inter_.rank()) +
                      ", but its node comes at " + std::to_string(inter_rank) +
                      " among the nodes with a rank of local index " + std::to_string(local_) +
                      " (nodes in the order of their first ranks)");
    }
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(node_of_.size()); }
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return node_of_; }
  /// The fewest ranks on a node: the blocks of an all-reduce, and the leaders per node.
  [[nodiscard]] int leaders() const noexcept { return leaders_; }
  [[nodiscard]] int nodes() const noexcept { return nodes_; }
  [[nodiscard]] bool leader() const noexcept { return intra_.rank() < leaders_; }
  [[nodiscard]] Intra& intra() noexcept { return intra_; }
  [[nodiscard]] Inter& inter() noexcept { return inter_; }
  [[nodiscard]] const two_level_options& options() const noexcept { return opt_; }
  /// Intra's stream, where a call's work is queued and ends (device transports only).
  [[nodiscard]] auto stream() const noexcept
    requires requires(const Intra& c) { c.stream(); }
  {
    return intra_.stream();
  }

  /// The call check (check_calls on either level's communicator, or WEFT_CHECK_CALLS=1): every
  /// rank's call of this two_level is compared, on its node and then across the nodes, before
  /// any data moves. The levels' own calls cannot tell: an average travels as a sum, and roots
  /// as node and local indices that different calls may share.
  template <class T, class Op>
  void check_call(collective c, std::size_t count, int root) {
    if (!detail::check_calls_enabled(intra_) && !detail::check_calls_enabled(inter_)) return;
    const detail::call_signature sig{c, "two_level", count, dtype_of<T>, detail::call_op_name<Op>(), root};
    detail::check_same_call(intra_, sig);
    detail::check_same_call(inter_, sig);
  }

  /// Every rank of the world has reached it: the node's ranks, then the first rank of each node.
  void barrier() {
    intra_.barrier();
    if (intra_.rank() == 0) inter_.barrier();
    intra_.barrier();
  }

private:
  // The collectives, on pointers: the free functions below check the call (buffers, root,
  // the call check) and scale half averages, then come here through two_level_access.
  friend struct detail::two_level_access;

  template <class Algo, class T, class Op>
  void all_reduce(const T* in, T* out, std::size_t count, const Op& op) {
    check_stages<Algo>();
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    if (nodes_ == 1) {
      run_all_reduce<IA>(intra_, in, out, count, op);
      return;
    }
    if (nodes_ == size()) {  // one rank per node
      inter_alone([&] { run_all_reduce<OA>(inter_, in, out, count, op); });
      return;
    }
    if constexpr (IA::serves(collective::reduce_scatter) && IA::serves(collective::all_gather)) {
      if (even_) {
        const std::size_t head = count - count % to_size(leaders_);
        all_reduce_even<IA, OA>(in, out, head, op);
        in += head;
        out += head;
        count -= head;  // fewer than L elements left: by blocks below
      }
    }
    if (count == 0) return;
    constexpr bool average = is_average_v<Op>;
    const detail::summing_t<Op> sop(op);  // avg sums in the stages, then divides once
    const std::size_t chunk = chunk_elements<T>();
    const std::size_t chunks = chunk_count(count, chunk);
    const auto span_of = [&](std::size_t k) { return chunk_span(k, chunk, count); };
    const auto reduce_chunk = [&](std::size_t k) {
      const auto [first, len] = span_of(k);
      for (int j = 0; j < leaders_; ++j) {
        const auto [b, e] = block(len, j);
        if (b == e) continue;
        const std::span<const T> src(in + first + b, e - b);
        const std::span<T> dst(out + first + b, intra_.rank() == j ? e - b : 0);
        weft::reduce<IA>(intra_, src, dst, j, sop);
      }
    };
    const auto reduce_across = [&](std::size_t k) {
      const auto [first, len] = span_of(k);
      const auto [b, e] = block(len, local_);
      if (b == e) return;
      weft::all_reduce<OA>(inter_, std::span<T>(out + first + b, e - b), sop);
      if constexpr (average) handoff_.divide(inter_, out + first + b, e - b, size());
    };
    const auto broadcast_chunk = [&](std::size_t k) {
      const auto [first, len] = span_of(k);
      for (int j = 0; j < leaders_; ++j) {
        const auto [b, e] = block(len, j);
        if (b != e) weft::broadcast<IA>(intra_, std::span<T>(out + first + b, e - b), j);
      }
    };
    const bool lead = leader();
    reduce_chunk(0);
    if (lead) handoff_(intra_, inter_);
    for (std::size_t k = 0; k < chunks; ++k) {
      if (lead) reduce_across(k);
      if (k + 1 < chunks) {
        reduce_chunk(k + 1);
        if (lead) handoff_(intra_, inter_);  // Inter's next chunk waits for this reduce, not for the broadcast below
      }
      if (lead) handoff_(inter_, intra_);
      broadcast_chunk(k);
    }
  }

  /// data from world rank `root` to every rank. Per chunk: the root's node broadcasts it from
  /// the root (Intra); leader j sends block j from the root's node to the leaders j of the
  /// other nodes (Inter's broadcast); each other node spreads block j from its local rank j
  /// (on even nodes by broadcast_even, but for the last count mod L elements).
  template <class Algo, class T>
  void broadcast(T* data, std::size_t count, int root) {
    check_stages<Algo>();
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    const int root_node = color_of_[to_size(root)];
    const int root_local = local_of_[to_size(root)];
    if (nodes_ == 1 || nodes_ == size()) {  // one level: one node, or one rank per node
      if (nodes_ == 1) weft::broadcast<IA>(intra_, std::span<T>(data, count), root_local);
      else inter_alone([&] { weft::broadcast<OA>(inter_, std::span<T>(data, count), root_node); });
      return;
    }
    if constexpr (IA::serves(collective::all_gather)) {
      if (even_) {
        const std::size_t head = count - count % to_size(leaders_);
        broadcast_even<IA, OA>(data, head, root);
        data += head;
        count -= head;  // fewer than L elements left: by blocks below
      }
    }
    if (count == 0) return;
    const std::size_t chunk = chunk_elements<T>();
    const std::size_t chunks = chunk_count(count, chunk);
    const bool lead = leader();
    const auto across = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      const auto [b, e] = block(len, local_);
      if (b != e) weft::broadcast<OA>(inter_, std::span<T>(data + first + b, e - b), root_node);
    };
    if (color_ == root_node) {
      const auto whole = [&](std::size_t k) {
        const auto [first, len] = chunk_span(k, chunk, count);
        weft::broadcast<IA>(intra_, std::span<T>(data + first, len), root_local);
      };
      whole(0);
      for (std::size_t k = 0; k < chunks; ++k) {
        if (lead) {
          handoff_(intra_, inter_);  // chunk k is here
          across(k);
        }
        if (k + 1 < chunks) whole(k + 1);
      }
    } else {
      if (lead) handoff_(intra_, inter_);  // the caller's earlier work on the buffer
      for (std::size_t k = 0; k < chunks; ++k) {
        if (lead) {
          across(k);
          handoff_(inter_, intra_);
        }
        const auto [first, len] = chunk_span(k, chunk, count);
        for (int j = 0; j < leaders_; ++j) {
          const auto [b, e] = block(len, j);
          if (b != e) weft::broadcast<IA>(intra_, std::span<T>(data + first + b, e - b), j);
        }
      }
    }
    if (lead) handoff_(inter_, intra_);  // the call ends on Intra's stream
  }

  /// out (at world rank `root` only) = the reduction of every rank's `in`. Per chunk: every
  /// node reduces block j onto its local rank j (Intra); the leaders j reduce it onto the root's
  /// node (Inter); there, blocks held by a local rank other than the root's are broadcast
  /// (Intra) and the root keeps them. op::avg sums, then the root divides by the world size.
  /// On even nodes by reduce_even, but for the last count mod L elements.
  template <class Algo, class T, class Op>
  void reduce(const T* in, T* out, std::size_t count, int root, const Op& op) {
    check_stages<Algo>();
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    const int root_node = color_of_[to_size(root)];
    const int root_local = local_of_[to_size(root)];
    const bool at_root = rank_ == root;
    if (nodes_ == 1 || nodes_ == size()) {
      const std::span<const T> src(in, count);
      const std::span<T> dst(out, at_root ? count : 0);
      if (nodes_ == 1) weft::reduce<IA>(intra_, src, dst, root_local, op);
      else inter_alone([&] { weft::reduce<OA>(inter_, src, dst, root_node, op); });
      return;
    }
    if constexpr (IA::serves(collective::reduce_scatter) && IA::serves(collective::all_gather)) {
      if (even_) {
        const std::size_t head = count - count % to_size(leaders_);
        reduce_even<IA, OA>(in, out, head, root, op);
        in += head;
        out += at_root ? head : 0;
        count -= head;  // fewer than L elements left: by blocks below
      }
    }
    if (count == 0) return;
    constexpr bool average = is_average_v<Op>;
    const detail::summing_t<Op> sop(op);  // avg sums in the stages, then divides once
    const std::size_t chunk = chunk_elements<T>();
    const std::size_t chunks = chunk_count(count, chunk);
    const bool lead = leader();
    const bool on_root_node = color_ == root_node;
    // A leader's block of chunk k, reduced over its node, lives at slot k of `part`; on the
    // root's node the ranks that only pass blocks on to the root receive them into `sink`.
    // (sized by the longest chunk there is: chunk_bytes may well exceed the whole call)
    const std::size_t longest = std::min(chunk, count);
    const std::size_t slot = (longest + static_cast<std::size_t>(leaders_) - 1) / static_cast<std::size_t>(leaders_);
    auto part = handoff_.template scratch<T>(intra_, lead ? chunks * slot : 0);
    auto sink = handoff_.template scratch<T>(intra_, on_root_node && !at_root ? slot : 0);
    const auto reduce_within = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      for (int j = 0; j < leaders_; ++j) {
        const auto [b, e] = block(len, j);
        if (b == e) continue;
        // Only rank j receives (part is empty on the others: no pointer into it there).
        const std::span<T> dst = local_ == j ? std::span<T>(part.data() + k * slot, e - b) : std::span<T>{};
        weft::reduce<IA>(intra_, std::span<const T>(in + first + b, e - b), dst, j, sop);
      }
    };
    const auto reduce_across = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      const auto [b, e] = block(len, local_);
      if (b == e) return;
      T* const mine = part.data() + k * slot;
      T* const dst = at_root ? out + first + b : mine;  // the root's node's other leaders: in place
      weft::reduce<OA>(inter_, std::span<const T>(mine, e - b), std::span<T>(dst, on_root_node ? e - b : 0), root_node,
                       sop);
    };
    const auto hand_to_root = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      for (int j = 0; j < leaders_; ++j) {
        const auto [b, e] = block(len, j);
        if (b == e || j == root_local) continue;
        T* const buf = at_root ? out + first + b : local_ == j ? part.data() + k * slot : sink.data();
        weft::broadcast<IA>(intra_, std::span<T>(buf, e - b), j);
      }
    };
    reduce_within(0);
    for (std::size_t k = 0; k < chunks; ++k) {
      if (lead) {
        handoff_(intra_, inter_);
        reduce_across(k);
      }
      if (k + 1 < chunks) reduce_within(k + 1);
      if (on_root_node) {
        if (lead) handoff_(inter_, intra_);
        hand_to_root(k);
      }
    }
    if (lead) handoff_(inter_, intra_);  // ends on Intra's stream, before `part` is released there
    if constexpr (average) {
      if (at_root) handoff_.divide(intra_, out, count, size());
    }
  }

  /// out (n elements) = the reduction of block rank() (n elements) of every rank's in. Each
  /// rank's block, by pieces of up to a chunk: every node reduces it onto its local rank
  /// i mod m (Intra), those leaders reduce it onto the block's node (Inter), where it lands on
  /// its rank (when i >= m, on uneven nodes, by a broadcast from the leader). Interleaved
  /// nodes reorder the input into a node-major copy first.
  template <class Algo, class T, class Op>
  void reduce_scatter(const T* in, T* out, std::size_t n, const Op& op) {
    check_stages<Algo>();
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    const auto p = static_cast<std::size_t>(size());
    // One level, where its algorithm plans a reduce_scatter (else the pieces below work too).
    if constexpr (IA::serves(collective::reduce_scatter)) {
      if (nodes_ == 1) {
        weft::reduce_scatter<IA>(intra_, std::span<const T>(in, n * p), std::span<T>(out, n), op);
        return;
      }
    }
    if constexpr (OA::serves(collective::reduce_scatter)) {
      if (nodes_ == size()) {
        inter_alone([&] { weft::reduce_scatter<OA>(inter_, std::span<const T>(in, n * p), std::span<T>(out, n), op); });
        return;
      }
    }
    if (n == 0) return;
    if constexpr (IA::serves(collective::reduce_scatter) && OA::serves(collective::reduce_scatter)) {
      if (even_) {
        reduce_scatter_even<IA, OA>(in, out, n, op);
        return;
      }
    }
    constexpr bool average = is_average_v<Op>;
    const detail::summing_t<Op> sop(op);  // avg sums in the stages, then divides once
    auto ordered = handoff_.template scratch<T>(intra_, contiguous_ ? 0 : p * n);
    const T* x = in;
    if (!contiguous_) {
      for (std::size_t r = 0; r < p; ++r) handoff_.copy(intra_, ordered.data() + to_size(pos_[r]) * n, in + r * n, n);
      x = ordered.data();
    }
    const auto pieces = rank_pieces<T>(n);
    const bool lead = leader();
    std::size_t carried = 0;  // a leader's rank blocks (i mod m == its local rank)
    for (int c = 0; c < nodes_; ++c) {
      for (int i = 0; i < node_size_[to_size(c)]; ++i) carried += lead && i % leaders_ == local_;
    }
    auto part = handoff_.template scratch<T>(intra_, carried * n);
    const bool extras_here = node_size_[to_size(color_)] > leaders_;  // blocks handed on by a broadcast
    auto sink = handoff_.template scratch<T>(intra_, extras_here ? std::min(n, chunk_elements<T>()) : 0);
    const auto within = [&](const rank_piece& q) {
      const std::span<T> dst = local_ == q.leader ? std::span<T>(part.data() + q.slot, q.len) : std::span<T>{};
      weft::reduce<IA>(intra_, std::span<const T>(x + q.offset, q.len), dst, q.leader, sop);
    };
    const auto across = [&](const rank_piece& q) {
      T* const mine = part.data() + q.slot;
      const bool home = color_ == q.node;
      T* const dst = home && local_ == q.local ? out + q.first : mine;
      weft::reduce<OA>(inter_, std::span<const T>(mine, q.len), std::span<T>(dst, home ? q.len : 0), q.node, sop);
    };
    const auto hand_on = [&](const rank_piece& q) {
      T* const buf = local_ == q.local ? out + q.first : local_ == q.leader ? part.data() + q.slot : sink.data();
      weft::broadcast<IA>(intra_, std::span<T>(buf, q.len), q.leader);
    };
    within(pieces.front());
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const auto& q = pieces[k];
      const bool carries = local_ == q.leader;
      if (carries) {
        handoff_(intra_, inter_);
        across(q);
      }
      if (k + 1 < pieces.size()) within(pieces[k + 1]);
      if (q.local != q.leader && color_ == q.node) {
        if (carries) handoff_(inter_, intra_);
        hand_on(q);
      }
    }
    if (lead) handoff_(inter_, intra_);
    if constexpr (average) handoff_.divide(intra_, out, n, size());
  }

  /// Block r (n elements) of out = rank r's in, on every rank. The node gathers its own
  /// ranks' blocks (Intra); then, by pieces of up to a chunk, rank block i of each node goes
  /// across from that node's local rank i mod m to the other nodes' (Inter's broadcast), which
  /// spread it on their node. Interleaved nodes gather node-major, then reorder.
  template <class Algo, class T>
  void all_gather(const T* in, T* out, std::size_t n) {
    check_stages<Algo>();
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    const auto p = static_cast<std::size_t>(size());
    if constexpr (IA::serves(collective::all_gather)) {
      if (nodes_ == 1) {
        weft::all_gather<IA>(intra_, std::span<const T>(in, n), std::span<T>(out, n * p));
        return;
      }
    }
    if constexpr (OA::serves(collective::all_gather)) {
      if (nodes_ == size()) {
        inter_alone([&] { weft::all_gather<OA>(inter_, std::span<const T>(in, n), std::span<T>(out, n * p)); });
        return;
      }
    }
    if (n == 0) return;
    if constexpr (IA::serves(collective::all_gather) && OA::serves(collective::all_gather)) {
      if (even_) {
        all_gather_even<IA, OA>(in, out, n);
        return;
      }
    }
    auto ordered = handoff_.template scratch<T>(intra_, contiguous_ ? 0 : p * n);
    T* const w = contiguous_ ? out : ordered.data();
    const auto here = to_size(node_first_[to_size(color_)]) * n;
    const int mine = node_size_[to_size(color_)];
    if constexpr (IA::serves(collective::all_gather)) {
      weft::all_gather<IA>(intra_, std::span<const T>(in, n), std::span<T>(w + here, to_size(mine) * n));
    } else {  // IA plans broadcasts only (tree): one per rank of the node
      handoff_.copy(intra_, w + here + to_size(local_) * n, in, n);
      for (int i = 0; i < mine; ++i) weft::broadcast<IA>(intra_, std::span<T>(w + here + to_size(i) * n, n), i);
    }
    const bool lead = leader();
    if (lead) handoff_(intra_, inter_);
    for (const auto& q : rank_pieces<T>(n)) {
      const bool carries = local_ == q.leader;
      if (carries) weft::broadcast<OA>(inter_, std::span<T>(w + q.offset, q.len), q.node);
      if (color_ != q.node) {
        if (carries) handoff_(inter_, intra_);
        weft::broadcast<IA>(intra_, std::span<T>(w + q.offset, q.len), q.leader);
      }
    }
    if (lead) handoff_(inter_, intra_);
    if (!contiguous_) {
      for (std::size_t r = 0; r < p; ++r) handoff_.copy(intra_, out + r * n, w + to_size(pos_[r]) * n, n);
    }
  }

  /// A call that is Inter's alone (one rank per node): ordered after the caller's work on
  /// Intra's stream, and ending there, as every call does (on GPUs the levels' streams differ).
  template <class F>
  void inter_alone(F&& call) {
    handoff_(intra_, inter_);
    std::forward<F>(call)();
    handoff_(inter_, intra_);
  }

  /// Where world rank r's block sits in local-major order (local index, then node): the order
  /// in which one Intra reduce_scatter (all_gather) of N blocks per rank meets, on each local
  /// rank, the blocks of its local index on every node.
  [[nodiscard]] std::size_t local_major(std::size_t r) const noexcept {
    return to_size(local_of_[r]) * to_size(nodes_) + to_size(color_of_[r]);
  }

  /// all_reduce on even nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// reduce_scatter and all_gather: per chunk one Intra reduce_scatter leaves local rank j block
  /// j of the node's sum in scratch, the leaders j all-reduce it across nodes (Inter), and one
  /// Intra all_gather brings the blocks back. The same blocks and pipeline as the general path,
  /// in three calls per chunk instead of 2L + 1.
  template <class IA, class OA, class T, class Op>
  void all_reduce_even(const T* in, T* out, std::size_t count, const Op& op) {
    const detail::summing_t<Op> sop(op);
    const auto across = [&](std::span<T> block) {
      weft::all_reduce<OA>(inter_, block, sop);
      if constexpr (is_average_v<Op>) handoff_.divide(inter_, block.data(), block.size(), size());
    };
    reduce_by_blocks<IA>(in, count, sop, across, [&](std::size_t first) { return out + first; });
  }

  /// reduce on even nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// reduce_scatter and all_gather: per chunk one Intra reduce_scatter leaves local rank j block
  /// j of its node's sum, the leaders j reduce it onto the root's node (Inter), and there one
  /// Intra all_gather brings the blocks to the root (the others of that node receive them into
  /// scratch). Two or three calls per chunk instead of 2L.
  template <class IA, class OA, class T, class Op>
  void reduce_even(const T* in, T* out, std::size_t count, int root, const Op& op) {
    const int root_node = color_of_[to_size(root)];
    const bool on_root_node = color_ == root_node;
    const bool at_root = rank_ == root;
    const detail::summing_t<Op> sop(op);
    auto sink = handoff_.template scratch<T>(intra_, on_root_node && !at_root ? std::min(count, even_chunk<T>()) : 0);
    const auto across = [&](std::span<T> block) {  // in place on the root's node
      weft::reduce<OA>(inter_, std::span<const T>(block), block.first(on_root_node ? block.size() : 0), root_node, sop);
    };
    reduce_by_blocks<IA>(in, count, sop, across, [&](std::size_t first) -> T* {
      return !on_root_node ? nullptr : at_root ? out + first : sink.data();
    });
    if constexpr (is_average_v<Op>) {
      if (at_root) handoff_.divide(intra_, out, count, size());
    }
  }

  /// The pipeline of all_reduce_even and reduce_even over even_chunk()s of `in`: per chunk k one
  /// Intra reduce_scatter into block k of scratch (this local rank's len / L elements of the
  /// node's sum), across(block) on Inter, and, where into(first element) gives a destination,
  /// one Intra all_gather of the chunk's blocks there. Chunk k + 1's reduce_scatter is queued
  /// before chunk k's all_gather, so on GPUs Inter's work on chunk k overlaps it.
  template <class IA, class T, class Op, class Across, class Into>
  void reduce_by_blocks(const T* in, std::size_t count, const Op& sop, const Across& across, const Into& into) {
    if (count == 0) return;
    const auto L = to_size(leaders_);
    const std::size_t chunk = even_chunk<T>();
    const std::size_t chunks = chunk_count(count, chunk);
    auto part = handoff_.template scratch<T>(intra_, count / L);
    const auto block = [&](std::size_t k) {
      return std::span<T>(part.data() + k * (chunk / L), chunk_span(k, chunk, count).second / L);
    };
    const auto reduce_chunk = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      weft::reduce_scatter<IA>(intra_, std::span<const T>(in + first, len), block(k), sop);
    };
    reduce_chunk(0);
    handoff_(intra_, inter_);
    for (std::size_t k = 0; k < chunks; ++k) {
      across(block(k));
      if (k + 1 < chunks) {
        reduce_chunk(k + 1);
        handoff_(intra_, inter_);  // Inter's next chunk waits for this reduce, not for the gather below
      }
      const auto [first, len] = chunk_span(k, chunk, count);
      if (T* const dst = into(first)) {
        handoff_(inter_, intra_);
        weft::all_gather<IA>(intra_, std::span<const T>(block(k)), std::span<T>(dst, len));
      }
    }
    handoff_(inter_, intra_);  // ends on Intra's stream, before the scratch is released there
  }

  /// broadcast on even nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// all_gather: per chunk the root's node broadcasts it from the root (Intra), its local rank j
  /// sends block j to the other nodes' local ranks j (Inter), which receive it into scratch, and
  /// one Intra all_gather spreads the blocks on each of those nodes. One Intra call per chunk on
  /// every node instead of L.
  template <class IA, class OA, class T>
  void broadcast_even(T* data, std::size_t count, int root) {
    if (count == 0) return;
    const auto L = to_size(leaders_);
    const int root_node = color_of_[to_size(root)];
    const std::size_t chunk = even_chunk<T>();
    const std::size_t chunks = chunk_count(count, chunk);
    if (color_ == root_node) {
      const int root_local = local_of_[to_size(root)];
      const auto whole = [&](std::size_t k) {
        const auto [first, len] = chunk_span(k, chunk, count);
        weft::broadcast<IA>(intra_, std::span<T>(data + first, len), root_local);
      };
      whole(0);
      for (std::size_t k = 0; k < chunks; ++k) {
        handoff_(intra_, inter_);  // chunk k is here
        const auto [first, len] = chunk_span(k, chunk, count);
        weft::broadcast<OA>(inter_, std::span<T>(data + first + to_size(local_) * (len / L), len / L), root_node);
        if (k + 1 < chunks) whole(k + 1);
      }
    } else {
      auto part = handoff_.template scratch<T>(intra_, count / L);
      handoff_(intra_, inter_);  // the caller's earlier work on the buffer, and the scratch
      for (std::size_t k = 0; k < chunks; ++k) {
        const auto [first, len] = chunk_span(k, chunk, count);
        const std::span<T> block(part.data() + k * (chunk / L), len / L);
        weft::broadcast<OA>(inter_, block, root_node);
        handoff_(inter_, intra_);
        weft::all_gather<IA>(intra_, std::span<const T>(block), std::span<T>(data + first, len));
      }
    }
    handoff_(inter_, intra_);  // the call ends on Intra's stream, after the scratch's last use
  }

  /// reduce_scatter on even nodes (L ranks each), where both levels plan one: the blocks copied
  /// local-major, one Intra reduce_scatter leaves local rank l the node's sums of the N blocks
  /// of local index l, and one Inter reduce_scatter of those leaves each rank its own block. Two
  /// calls, and N blocks per rank cross between nodes.
  template <class IA, class OA, class T, class Op>
  void reduce_scatter_even(const T* in, T* out, std::size_t n, const Op& op) {
    const auto p = to_size(size());
    const auto N = to_size(nodes_);
    const detail::summing_t<Op> sop(op);
    auto major = handoff_.template scratch<T>(intra_, p * n);
    reorder(major.data(), in, n, order::local_major);
    auto sums = handoff_.template scratch<T>(intra_, N * n);
    weft::reduce_scatter<IA>(intra_, std::span<const T>(major.data(), p * n), std::span<T>(sums.data(), N * n), sop);
    handoff_(intra_, inter_);
    weft::reduce_scatter<OA>(inter_, std::span<const T>(sums.data(), N * n), std::span<T>(out, n), sop);
    handoff_(inter_, intra_);  // ends on Intra's stream, before the scratch is released there
    if constexpr (is_average_v<Op>) handoff_.divide(intra_, out, n, size());
  }

  /// all_gather on even nodes, where both levels plan one: Inter gathers the N blocks of this
  /// local index, Intra gathers those of every local index (local-major), and a copy puts each
  /// rank's block at its place. Two calls.
  template <class IA, class OA, class T>
  void all_gather_even(const T* in, T* out, std::size_t n) {
    const auto p = to_size(size());
    const auto N = to_size(nodes_);
    auto mine = handoff_.template scratch<T>(intra_, N * n);
    auto major = handoff_.template scratch<T>(intra_, p * n);
    handoff_(intra_, inter_);  // the caller's work on `in`
    weft::all_gather<OA>(inter_, std::span<const T>(in, n), std::span<T>(mine.data(), N * n));
    handoff_(inter_, intra_);
    weft::all_gather<IA>(intra_, std::span<const T>(mine.data(), N * n), std::span<T>(major.data(), p * n));
    reorder(out, major.data(), n, order::rank);
  }

  enum class order { rank, local_major };
  /// Copies the p blocks of n elements from `src` to `dst` into order `to` (from the other
  /// order), on Intra's stream: where nodes are contiguous, local index l's blocks are every
  /// L-th in rank order, so one strided copy per local index; else one copy per rank.
  template <class T>
  void reorder(T* dst, const T* src, std::size_t n, order to) {
    const auto N = to_size(nodes_);
    if (contiguous_) {
      const auto L = to_size(leaders_);
      for (std::size_t l = 0; l < L; ++l) {
        if (to == order::local_major) {
          handoff_.copy_rows(intra_, dst + l * N * n, n, src + l * n, L * n, n, N);
        } else {
          handoff_.copy_rows(intra_, dst + l * n, L * n, src + l * N * n, n, n, N);
        }
      }
      return;
    }
    for (std::size_t r = 0; r < to_size(size()); ++r) {
      const std::size_t major = local_major(r) * n;
      const std::size_t ranked = r * n;
      if (to == order::local_major) {
        handoff_.copy(intra_, dst + major, src + ranked, n);
      } else {
        handoff_.copy(intra_, dst + ranked, src + major, n);
      }
    }
  }

  /// Piece of rank block i of node `node`, carried between nodes by local rank `leader`
  /// (i mod m): elements [first, first + len) of the block, at `offset` in node-major order;
  /// `slot`, where the carrying leader keeps it (reduce_scatter).
  struct rank_piece {
    int node, local, leader;
    std::size_t first, len, offset, slot;
  };
  template <class T>
  [[nodiscard]] std::vector<rank_piece> rank_pieces(std::size_t n) const {
    std::vector<rank_piece> ps;
    const std::size_t chunk = chunk_elements<T>();
    std::size_t slot = 0;
    for (int c = 0; c < nodes_; ++c) {
      for (int i = 0; i < node_size_[to_size(c)]; ++i) {
        const int leader = i % leaders_;
        for (std::size_t first = 0; first < n; first += chunk) {
          const std::size_t len = std::min(chunk, n - first);
          ps.push_back({c, i, leader, first, len, to_size(node_first_[to_size(c)] + i) * n + first, slot + first});
        }
        if (leader == local_) slot += n;
      }
    }
    return ps;
  }
  static constexpr std::size_t to_size(int v) noexcept { return static_cast<std::size_t>(v); }
  template <class Algo>
  static constexpr void check_stages() {
    static_assert(algo::is_stages_v<Algo>,
                  "weft::two_level: name each level's algorithm with algo::stages<IntraAlgo, InterAlgo>, e.g. "
                  "stages<algo::direct, algo::vendor>; the default stages<> is automatic at both");
  }
  template <class T>
  [[nodiscard]] std::size_t chunk_elements() const noexcept {
    return std::max<std::size_t>(1, opt_.chunk_bytes / sizeof(T));
  }
  /// The even paths' chunk: chunk_bytes rounded down to a multiple of L elements, at least L.
  template <class T>
  [[nodiscard]] std::size_t even_chunk() const noexcept {
    const auto L = to_size(leaders_);
    return std::max(L, chunk_elements<T>() / L * L);
  }
  static std::size_t chunk_count(std::size_t count, std::size_t chunk) noexcept {
    return count == 0 ? 0 : 1 + (count - 1) / chunk;  // no count + chunk - 1: chunk may be near SIZE_MAX
  }
  /// (first element, length) of chunk k.
  static std::pair<std::size_t, std::size_t> chunk_span(std::size_t k, std::size_t chunk, std::size_t count) noexcept {
    const std::size_t first = k * chunk;
    return {first, std::min(chunk, count - first)};
  }
  /// [begin, end) of block j of a chunk of len elements: m blocks, sizes within one.
  [[nodiscard]] std::pair<std::size_t, std::size_t> block(std::size_t len, int j) const noexcept {
    const auto m = static_cast<std::size_t>(leaders_);
    return {len * static_cast<std::size_t>(j) / m, len * static_cast<std::size_t>(j + 1) / m};
  }
  template <class A, class C, class T, class Op>
  static void run_all_reduce(C& comm, const T* in, T* out, std::size_t count, const Op& op) {
    if (in == out) {
      weft::all_reduce<A>(comm, std::span<T>(out, count), op);
    } else {
      weft::all_reduce<A>(comm, std::span<const T>(in, count), std::span<T>(out, count), op);
    }
  }

  std::shared_ptr<const void> held_;  // first: released after the communicators that borrow it
  Intra intra_;
  Inter inter_;
  std::vector<int> node_of_;
  int rank_ = 0;
  two_level_options opt_;
  Handoff handoff_;
  int nodes_ = 1;
  std::vector<int> node_size_, node_first_;  // by node (numbered by first rank): ranks, node-major offset
  std::vector<int> color_of_, local_of_;     // by world rank: its node's number, its index there
  std::vector<int> pos_;                     // world rank -> node-major position
  bool contiguous_ = true;                   // node-major order is world order
  int local_ = 0;  // this rank's index on its node (Intra's rank)
  int color_ = 0;  // this rank's node, numbered by first rank (the inter communicators' rank of it)
  int leaders_ = 1;
  bool even_ = true;  // every node has leaders_ ranks
};

/// A two_level of one transport, split from `world` by its node_of(): Intra = the ranks of
/// this rank's node, Inter = the ranks of its local index. Collective over `world`.
template <communicator World, class Handoff = host_handoff>
two_level<World, World, Handoff> make_two_level(World& world, two_level_options opt = {}, Handoff handoff = {}) {
  const std::vector<int> node_of = world.node_of();
  const int rank = world.rank();
  const int color = detail::node_color(node_of, rank);
  World intra = world.split(color, rank);
  World inter = world.split(intra.rank(), color);
  return two_level<World, World, Handoff>(std::move(intra), std::move(inter), node_of, rank, opt, std::move(handoff));
}

namespace detail {

/// The free functions' way to two_level's collectives, which are private so that no call skips
/// the free functions' checks.
struct two_level_access {
  template <class Algo, class TL, class T, class Op>
  static void all_reduce(TL& c, const T* in, T* out, std::size_t n, const Op& op) {
    c.template all_reduce<Algo>(in, out, n, op);
  }
  template <class Algo, class TL, class T, class Op>
  static void reduce_scatter(TL& c, const T* in, T* out, std::size_t n, const Op& op) {
    c.template reduce_scatter<Algo>(in, out, n, op);
  }
  template <class Algo, class TL, class T>
  static void all_gather(TL& c, const T* in, T* out, std::size_t n) {
    c.template all_gather<Algo>(in, out, n);
  }
  template <class Algo, class TL, class T>
  static void broadcast(TL& c, T* data, std::size_t n, int root) {
    c.template broadcast<Algo>(data, n, root);
  }
  template <class Algo, class TL, class T, class Op>
  static void reduce(TL& c, const T* in, T* out, std::size_t n, int root, const Op& op) {
    c.template reduce<Algo>(in, out, n, root, op);
  }
};

/// half averages on the host as the plain collectives do (op::avg): each input scaled by
/// 1/ranks first, then summed, so that a mean half holds does not overflow on the way.
template <class Handoff, class T, class Op>
inline constexpr bool premultiplied_average =
    is_average_v<Op> && std::is_same_v<std::remove_cv_t<T>, half> && std::is_same_v<Handoff, host_handoff>;

/// call(input, op): with the n elements of `in` scaled by 1/ranks and op::sum where
/// premultiplied_average holds, else with `in` and `op` as given.
template <class Handoff, class T, class Op, class Call>
void premultiplying_averages(const T* in, std::size_t n, int ranks, const Op& op, Call&& call) {
  if constexpr (premultiplied_average<Handoff, T, Op>) {
    const auto scaled = scaled_by_ranks(in, n, ranks);
    call(static_cast<const T*>(scaled.data()), op::sum{});
  } else {
    call(in, op);
  }
}

} // namespace detail

template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, element T, class Op = op::sum>
  requires reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Handoff>& comm, std::span<T> inout, Op op = {}) {
  comm.template check_call<T, Op>(collective::all_reduce, inout.size(), 0);
  detail::premultiplying_averages<Handoff>(inout.data(), inout.size(), comm.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::all_reduce<Algo>(comm, src, inout.data(), inout.size(), o);
  });
}

template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, class In, element T,
          class Op = op::sum>
  requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Handoff>& comm, std::span<In> in, std::span<T> out, Op op = {}) {
  detail::check_all_reduce_buffers(comm.rank(), in, out);
  comm.template check_call<T, Op>(collective::all_reduce, in.size(), 0);
  detail::premultiplying_averages<Handoff>(in.data(), in.size(), comm.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::all_reduce<Algo>(comm, src, out.data(), in.size(), o);
  });
}

/// out (in.size() / size() elements) = the reduction of block rank() of every rank's in.
template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, class In, element T,
          class Op = op::sum>
  requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce_scatter(two_level<Intra, Inter, Handoff>& comm, std::span<In> in, std::span<T> out, Op op = {}) {
  detail::check_reduce_scatter_buffers(comm.rank(), comm.size(), in, out);
  comm.template check_call<T, Op>(collective::reduce_scatter, out.size(), 0);
  detail::premultiplying_averages<Handoff>(in.data(), in.size(), comm.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::reduce_scatter<Algo>(comm, src, out.data(), out.size(), o);
  });
}

/// Block r of out (in.size() elements each) = rank r's in, on every rank.
template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, class In, element T>
  requires std::same_as<std::remove_const_t<In>, T>
void all_gather(two_level<Intra, Inter, Handoff>& comm, std::span<In> in, std::span<T> out) {
  detail::check_all_gather_buffers(comm.rank(), comm.size(), in, out);
  comm.template check_call<T, op::sum>(collective::all_gather, in.size(), 0);
  detail::two_level_access::all_gather<Algo>(comm, in.data(), out.data(), in.size());
}

/// data from world rank `root` to every rank of the two_level.
template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, element T>
void broadcast(two_level<Intra, Inter, Handoff>& comm, std::span<T> data, int root) {
  detail::check_two_level_root(comm, "broadcast", root);
  comm.template check_call<T, op::sum>(collective::broadcast, data.size(), root);
  detail::two_level_access::broadcast<Algo>(comm, data.data(), data.size(), root);
}

/// out, at world rank `root` (other ranks' out is not touched and may be empty), = the
/// reduction over every rank's in.
template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, class In, element T,
          class Op = op::sum>
  requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce(two_level<Intra, Inter, Handoff>& comm, std::span<In> in, std::span<T> out, int root, Op op = {}) {
  detail::check_two_level_root(comm, "reduce", root);
  detail::check_reduce_buffers(comm.rank(), comm.rank() == root, in, out);
  comm.template check_call<T, Op>(collective::reduce, in.size(), root);
  detail::premultiplying_averages<Handoff>(in.data(), in.size(), comm.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::reduce<Algo>(comm, src, out.data(), in.size(), root, o);
  });
}

} // namespace weft
