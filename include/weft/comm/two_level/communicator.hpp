#pragma once
// weft::two_level<Intra, Inter, Runtime>: the communicator (comm/two_level.hpp says what it is).
//
// all_reduce, by chunks of options::chunk_bytes; m = the fewest ranks on any node, and each
// chunk is cut into m blocks (sizes differ by at most one, the same on every node):
//   reduce     Intra: block j reduced onto local rank j, for j < m (Intra's reduce, root j)
//   all-reduce Inter: local rank j (a "leader") all-reduces block j with the leaders j of the
//              other nodes; only these blocks cross the slow link, 1/m of the data per leader
//   broadcast  Intra: block j broadcast from local rank j
// A node with more than m ranks gives its extra ranks no block: they take part in the reduce
// and the broadcast only, so nodes may hold different numbers of ranks. Chunks are queued as
// a pipeline, chunk k+1's reduce before chunk k's broadcast. On uniform nodes (L ranks each),
// where IntraAlgo plans reduce_scatter and all_gather, the m reduces of a chunk are one Intra
// reduce_scatter and the m broadcasts one all_gather (chunks a multiple of L elements; the
// last count mod L elements go by blocks as above). On GPUs Intra and Inter run on
// their own streams, ordered by events (the Runtime, weft::cuda::stream_runtime), so the inter-node
// all-reduce of one chunk overlaps the intra-node reduce of the next. One node: Intra's
// all-reduce; one rank per node: Inter's; each by the largest pieces that level takes in one
// call (all of it, but where a level's max_count bounds it: a p2p level's workspace).
//
// Chunk sizes: chunk_bytes' worth of elements, and no more than either level takes in one
// all-reduce (detail::two_level_chunk_elements), so that every level call of a chunk fits a
// p2p level's workspace; rounded down to whole 16 bytes where that leaves any, so that every
// chunk and level piece but the last starts on a 16-byte boundary of the buffer, where a
// device level's kernels move 16-byte packs. A chunk's blocks (one per leader) start on such
// boundaries too (detail::two_level_block).
//
// Every element is reduced at one place by Intra, then by Inter's all-reduce (bitwise equal on
// every leader with weft's plans), then only copied: every rank ends with the same bits.
// op::avg sums and divides once, by the whole group's size (half on the host: scales each input
// by 1/size first and sums, as the plain collectives do). The call's buffers are the
// transports' own (device memory for device transports); the call is queued on Intra's stream
// and returns when queued there, as the transports' calls do.
//
// Algorithms: algo::levels<IntraAlgo, InterAlgo> names each level's (IntraAlgo must plan
// reduce and broadcast: ring, tree, direct, automatic; InterAlgo all_reduce, or vendor for the
// transport's own). The default, levels<>, is automatic at both levels.
//
// broadcast and reduce (root: a world rank) use the same blocks and chunks: broadcast sends
// block j of each chunk across nodes from the root's node's local rank j to the other nodes'
// local ranks j, which spread it on their node; reduce is its mirror image, and on the root's
// node the blocks that did not end on the root are handed to it. On uniform nodes, where
// IntraAlgo plans all_gather (and, for reduce, reduce_scatter), the spreading is one Intra
// all_gather per chunk instead of m broadcasts, and reduce's m reduces one reduce_scatter.
//
// The Runtime (host_runtime, weft::cuda::stream_runtime) orders the levels (operator()(from, to))
// and gives a call what it needs besides the transports: scratch<T>(comm, n) (host memory from
// a pool kept between calls, or stream-ordered device memory), copy and copy_rows
// (std::copy_n, or cudaMemcpyAsync and cudaMemcpy2DAsync on comm's stream), and divide
// (op::avg's last step).
//
// Ranks are numbered as the world they were split from; rank(), size(), node_of() are the
// world's; a node's ranks need not be contiguous. Nodes are numbered in the order of their
// first ranks (detail::node_layout, by_first_rank): that is the inter communicators' rank
// order, which make_two_level splits with. A two_level is not itself split again:
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
#include <weft/comm/algorithm/detail/node_layout.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/two_level/host_runtime.hpp>
#include <weft/comm/two_level/levels.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft {

namespace detail {

/// Each rank's node, numbered in the order of the nodes' first ranks (node_layout's
/// by_first_rank): split colors (>= 0) that put each node's ranks together.
inline std::vector<int> node_colors(const std::vector<int>& node_of) {
  return node_layout(node_of, node_numbering::by_first_rank).node;
}

/// node_colors(node_of)[rank].
inline int node_color(const std::vector<int>& node_of, int rank) {
  return node_colors(node_of)[static_cast<std::size_t>(rank)];
}

/// The operator two_level's levels apply: op::avg sums (the division comes once, at the end).
template <class Op>
using summing_t = std::conditional_t<is_average_v<Op>, op::sum, Op>;

/// The most elements of element_size bytes that one call of collective c takes on `level`: its
/// max_count(c, element_size) where it has one (a p2p communicator, bounded by its workspace),
/// else no bound.
template <class Level>
std::size_t level_max_count(const Level& level, collective c, std::size_t element_size) {
  if constexpr (requires {
                  { level.max_count(c, element_size) } -> std::convertible_to<std::size_t>;
                }) {
    return level.max_count(c, element_size);
  } else {
    return std::numeric_limits<std::size_t>::max();
  }
}

/// The boundary, in bytes relative to a call's buffer, on which two_level starts every chunk or
/// level piece but the last: a device level's copy and reduce kernels move 16-byte packs, and a
/// piece that starts off it runs element by element on buffers that start on it.
inline constexpr std::size_t two_level_piece_bytes = 16;

/// The fewest elements of element_size bytes that span a whole number of two_level_piece_bytes.
constexpr std::size_t two_level_piece_quantum(std::size_t element_size) noexcept {
  return two_level_piece_bytes / std::gcd(two_level_piece_bytes, element_size);
}

/// n rounded down to a multiple of `quantum`, where one fits; else n.
constexpr std::size_t round_down_where_it_fits(std::size_t n, std::size_t quantum) noexcept {
  return n >= quantum ? n / quantum * quantum : n;
}

/// Elements per chunk of a two_level call, of element_size bytes each: chunk_bytes' worth (at
/// least one), and no more than `limit`, the most one level call takes (level_max_count),
/// rounded down to whole two_level_piece_bytes where that leaves at least one (so every chunk
/// but the last starts on that boundary). Throws where a level takes not even one element.
inline std::size_t two_level_chunk_elements(std::size_t chunk_bytes, std::size_t element_size,
                                            std::size_t limit) {
  if (limit == 0) {
    throw error(
        "two_level: a level takes no call of even one element of " + std::to_string(element_size) +
        " bytes (a p2p level's workspace is too small: raise p2p::options::workspace_bytes)");
  }
  return round_down_where_it_fits(
      std::min(std::max<std::size_t>(1, chunk_bytes / element_size), limit),
      two_level_piece_quantum(element_size));
}

/// The chunk of the uniform paths, whose chunks split into L blocks of chunk / L elements:
/// `chunk` elements rounded down to a multiple of L, and of L * two_level_piece_quantum where one
/// fits (so every chunk but the last, and each of its blocks, starts on two_level_piece_bytes);
/// at least L.
constexpr std::size_t two_level_uniform_chunk(std::size_t chunk, std::size_t L,
                                              std::size_t element_size) noexcept {
  return std::max(
      L, round_down_where_it_fits(chunk / L * L, L * two_level_piece_quantum(element_size)));
}

/// [begin, end) of block j of m of a chunk of len elements of element_size bytes: boundary j at
/// len * j / m (sizes within one), rounded down to whole two_level_piece_bytes, so that every
/// block starts on that boundary of the chunk (and of the buffer, as the chunk does); a block
/// may then be empty, or up to two_level_piece_quantum - 1 elements longer than another.
constexpr std::pair<std::size_t, std::size_t> two_level_block(std::size_t len, std::size_t j,
                                                              std::size_t m,
                                                              std::size_t element_size) noexcept {
  const std::size_t q = two_level_piece_quantum(element_size);
  const auto at = [&](std::size_t i) { return i >= m ? len : len * i / m / q * q; };
  return {at(j), at(j + 1)};
}

/// Room for any block (two_level_block) of a chunk of at most len elements: ceil(len / m) plus
/// two_level_piece_quantum - 1 (what rounding the boundaries down can add), rounded up to whole
/// two_level_piece_bytes so that slots of this size side by side start on that boundary too.
constexpr std::size_t two_level_block_room(std::size_t len, std::size_t m,
                                           std::size_t element_size) noexcept {
  const std::size_t q = two_level_piece_quantum(element_size);
  return ((len + m - 1) / m + q - 1 + q - 1) / q * q;
}

} // namespace detail

struct two_level_options {
  /// Bytes of each pipelined chunk of an all-reduce (the last may be shorter; a chunk is cut
  /// to what either level takes in one call where a level bounds it, a p2p level's workspace).
  std::size_t chunk_bytes = std::size_t{4} << 20;
};

namespace detail {
struct two_level_access;
} // namespace detail

template <communicator Intra, communicator Inter = Intra, class Runtime = host_runtime>
class two_level {
public:
  using intra_type = Intra;
  using inter_type = Inter;

  /// `intra`: this rank's node, ranked as the world ranks of that node in order; `inter`: the
  /// ranks of this rank's local index, one per node that has one, ranked in the order of the
  /// nodes' first world ranks; `node_of`: the world's node of each rank; `rank`: this rank in
  /// the world. make_two_level() builds all of it from a world communicator.
  /// `held`: what the communicators borrow (an MPI communicator, say), released after them.
  two_level(Intra intra, Inter inter, std::vector<int> node_of, int rank,
            two_level_options opt = {}, Runtime runtime = {}, std::shared_ptr<const void> held = {})
      : held_(std::move(held)),
        intra_(std::move(intra)),
        inter_(std::move(inter)),
        node_of_(std::move(node_of)),
        rank_(rank),
        opt_(opt),
        runtime_(std::move(runtime)) {
    const int size = static_cast<int>(node_of_.size());
    if (rank_ < 0 || rank_ >= size) {
      throw error("two_level", rank_, error::unknown,
                  "rank " + std::to_string(rank_) + " outside a world of " + std::to_string(size) +
                      " ranks (node_of)");
    }
    if (opt_.chunk_bytes == 0)
      throw error("two_level", rank_, error::unknown, "chunk_bytes must be at least 1");
    layout_ = detail::node_layout(node_of_, detail::node_numbering::by_first_rank);
    // Node-major order (nodes numbered by first rank, a node's ranks in world order): each
    // rank's node, its index there, each node's size and first position; where each rank's
    // block sits when every node's blocks are kept together.
    node_first_.assign(to_size(layout_.nodes()), 0);
    for (int c = 1; c < layout_.nodes(); ++c)
      node_first_[to_size(c)] = node_first_[to_size(c - 1)] + ranks_on(c - 1);
    pos_.resize(to_size(size));
    contiguous_ = true;
    for (std::size_t r = 0; r < pos_.size(); ++r) {
      pos_[r] = node_first_[to_size(layout_.node[r])] + layout_.local[r];
      contiguous_ = contiguous_ && pos_[r] == static_cast<int>(r);
    }
    color_ = layout_.node[to_size(rank_)];
    local_ = layout_.local[to_size(rank_)];
    const int mine = ranks_on(color_);
    const auto with_local = static_cast<int>(std::count_if(
        layout_.ranks.begin(), layout_.ranks.end(),
        [&](const std::vector<int>& n) { return static_cast<int>(n.size()) > local_; }));
    if (intra_.size() != mine || intra_.rank() != local_) {
      throw error("two_level", rank_, error::unknown,
                  "the intra-node communicator has rank " + std::to_string(intra_.rank()) + " of " +
                      std::to_string(intra_.size()) +
                      ", but node_of puts this rank at local index " + std::to_string(local_) +
                      " of " + std::to_string(mine) + " ranks on its node");
    }
    if (inter_.size() != with_local) {
      throw error("two_level", rank_, error::unknown,
                  "the inter-node communicator has " + std::to_string(inter_.size()) +
                      " ranks, but " + std::to_string(with_local) +
                      " nodes have a rank of local index " + std::to_string(local_));
    }
    int inter_rank = 0; // nodes before this one (by first rank) with a rank of this local index
    for (int c = 0; c < color_; ++c)
      inter_rank += ranks_on(c) > local_;
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
  [[nodiscard]] int min_ranks_per_node() const noexcept { return layout_.min_ranks_per_node(); }
  [[deprecated("use min_ranks_per_node()")]] [[nodiscard]] int leaders() const noexcept {
    return layout_.min_ranks_per_node();
  }
  [[nodiscard]] int nodes() const noexcept { return layout_.nodes(); }
  [[nodiscard]] bool leader() const noexcept {
    return intra_.rank() < layout_.min_ranks_per_node();
  }
  [[nodiscard]] Intra& intra() noexcept { return intra_; }
  [[nodiscard]] Inter& inter() noexcept { return inter_; }
  [[nodiscard]] const two_level_options& options() const noexcept { return opt_; }
  /// Intra's stream, where a call's work is queued and ends (device transports only).
  [[nodiscard]] auto stream() const noexcept requires requires(const Intra& c) { c.stream(); }
  { return intra_.stream(); }

  /// The call check (check_calls on either level's communicator, or WEFT_CHECK_CALLS=1): every
  /// rank's call of this two_level is compared, on its node and then across the nodes, before
  /// any data moves. The levels' own calls cannot tell: an average travels as a sum, and roots
  /// as node and local indices that different calls may share.
  template <class T, class Op>
  void check_call(collective c, std::size_t count, int root) {
    if (!detail::check_calls_enabled(intra_) && !detail::check_calls_enabled(inter_)) return;
    const detail::call_signature sig{
        c, "two_level", count, dtype_of<T>, detail::call_op_name<Op>(), root};
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
  // The collectives, on pointers: the free functions (collectives.hpp) check the call (buffers,
  // root, the call check) and scale half averages, then come here through two_level_access.
  friend struct detail::two_level_access;

  template <class Algo, class T, class Op>
  void all_reduce(const T* in, T* out, std::size_t count, const Op& op);

  /// data from world rank `root` to every rank. Per chunk: the root's node broadcasts it from
  /// the root (Intra); leader j sends block j from the root's node to the leaders j of the
  /// other nodes (Inter's broadcast); each other node spreads block j from its local rank j
  /// (on uniform nodes by broadcast_uniform, but for the last count mod L elements).
  template <class Algo, class T>
  void broadcast(T* data, std::size_t count, int root);

  /// out (at world rank `root` only) = the reduction of every rank's `in`. Per chunk: every
  /// node reduces block j onto its local rank j (Intra); the leaders j reduce it onto the root's
  /// node (Inter); there, blocks held by a local rank other than the root's are broadcast
  /// (Intra) and the root keeps them. op::avg sums, then the root divides by the world size.
  /// On uniform nodes by reduce_uniform, but for the last count mod L elements.
  template <class Algo, class T, class Op>
  void reduce(const T* in, T* out, std::size_t count, int root, const Op& op);

  /// out (n elements) = the reduction of block rank() (n elements) of every rank's in. Each
  /// rank's block, by pieces of up to a chunk: every node reduces it onto its local rank
  /// i mod m (Intra), those leaders reduce it onto the block's node (Inter), where it lands on
  /// its rank (when i >= m, on uneven nodes, by a broadcast from the leader). Interleaved
  /// nodes reorder the input into a node-major copy first.
  template <class Algo, class T, class Op>
  void reduce_scatter(const T* in, T* out, std::size_t n, const Op& op);

  /// Block r (n elements) of out = rank r's in, on every rank. The node gathers its own
  /// ranks' blocks (Intra); then, by pieces of up to a chunk, rank block i of each node goes
  /// across from that node's local rank i mod m to the other nodes' (Inter's broadcast), which
  /// spread it on their node. Interleaved nodes gather node-major, then reorder.
  template <class Algo, class T>
  void all_gather(const T* in, T* out, std::size_t n);

  /// A call that is Inter's alone (one rank per node): ordered after the caller's work on
  /// Intra's stream, and ending there, as every call does (on GPUs the levels' streams differ).
  template <class F>
  void inter_alone(F&& call) {
    runtime_(intra_, inter_);
    std::forward<F>(call)();
    runtime_(inter_, intra_);
  }

  /// Where world rank r's block sits in local-major order (local index, then node): the order
  /// in which one Intra reduce_scatter (all_gather) of N blocks per rank meets, on each local
  /// rank, the blocks of its local index on every node.
  [[nodiscard]] std::size_t local_major(std::size_t r) const noexcept {
    return to_size(layout_.local[r]) * to_size(layout_.nodes()) + to_size(layout_.node[r]);
  }

  /// all_reduce on uniform nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// reduce_scatter and all_gather: per chunk one Intra reduce_scatter leaves local rank j block
  /// j of the node's sum in scratch, the leaders j all-reduce it across nodes (Inter), and one
  /// Intra all_gather brings the blocks back. The same blocks and pipeline as the general path,
  /// in three calls per chunk instead of 2L + 1.
  template <class IA, class OA, class T, class Op>
  void all_reduce_uniform(const T* in, T* out, std::size_t count, const Op& op);

  /// reduce on uniform nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// reduce_scatter and all_gather: per chunk one Intra reduce_scatter leaves local rank j block
  /// j of its node's sum, the leaders j reduce it onto the root's node (Inter), and there one
  /// Intra all_gather brings the blocks to the root (the others of that node receive them into
  /// scratch). Two or three calls per chunk instead of 2L.
  template <class IA, class OA, class T, class Op>
  void reduce_uniform(const T* in, T* out, std::size_t count, int root, const Op& op);

  /// The pipeline of all_reduce_uniform and reduce_uniform over uniform_chunk()s of `in`: per chunk
  /// k one Intra reduce_scatter into block k of scratch (this local rank's len / L elements of the
  /// node's sum), across(block) on Inter, and, where into(first element) gives a destination,
  /// one Intra all_gather of the chunk's blocks there. Chunk k + 1's reduce_scatter is queued
  /// before chunk k's all_gather, so on GPUs Inter's work on chunk k overlaps it.
  template <class IA, class T, class Op, class Across, class Into>
  void reduce_by_blocks(const T* in, std::size_t count, const Op& sop, const Across& across,
                        const Into& into);

  /// broadcast on uniform nodes (L ranks each) of a count that L divides, where IntraAlgo plans
  /// all_gather: per chunk the root's node broadcasts it from the root (Intra), its local rank j
  /// sends block j to the other nodes' local ranks j (Inter), which receive it into scratch, and
  /// one Intra all_gather spreads the blocks on each of those nodes. One Intra call per chunk on
  /// every node instead of L.
  template <class IA, class OA, class T>
  void broadcast_uniform(T* data, std::size_t count, int root);

  /// reduce_scatter on uniform nodes (L ranks each), where both levels plan one: the blocks copied
  /// local-major, one Intra reduce_scatter leaves local rank l the node's sums of the N blocks
  /// of local index l, and one Inter reduce_scatter of those leaves each rank its own block. Two
  /// calls, and N blocks per rank cross between nodes.
  template <class IA, class OA, class T, class Op>
  void reduce_scatter_uniform(const T* in, T* out, std::size_t n, const Op& op);

  /// all_gather on uniform nodes, where both levels plan one: Inter gathers the N blocks of this
  /// local index, Intra gathers those of every local index (local-major), and a copy puts each
  /// rank's block at its place. Two calls.
  template <class IA, class OA, class T>
  void all_gather_uniform(const T* in, T* out, std::size_t n);

  enum class order { rank, local_major };
  /// Copies the p blocks of n elements from `src` to `dst` into order `to` (from the other
  /// order), on Intra's stream: where nodes are contiguous, local index l's blocks are every
  /// L-th in rank order, so one strided copy per local index; else one copy per rank.
  template <class T>
  void reorder(T* dst, const T* src, std::size_t n, order to);

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
    for (int c = 0; c < layout_.nodes(); ++c) {
      for (int i = 0; i < ranks_on(c); ++i) {
        const int leader = i % layout_.min_ranks_per_node();
        for (std::size_t first = 0; first < n; first += chunk) {
          const std::size_t len = std::min(chunk, n - first);
          ps.push_back({c, i, leader, first, len, to_size(node_first_[to_size(c)] + i) * n + first,
                        slot + first});
        }
        if (leader == local_) slot += n;
      }
    }
    return ps;
  }
  static constexpr std::size_t to_size(int v) noexcept { return static_cast<std::size_t>(v); }
  /// Ranks on node c.
  [[nodiscard]] int ranks_on(int c) const { return layout_.ranks_on(c); }
  template <class Algo>
  static constexpr void check_levels() {
    static_assert(algo::is_levels_v<Algo>,
                  "weft::two_level: name each level's algorithm with algo::levels<IntraAlgo, "
                  "InterAlgo>, e.g. "
                  "levels<algo::direct, algo::vendor>; the default levels<> is automatic at both");
  }
  /// Elements per chunk: options::chunk_bytes' worth, and no more than either level takes in one
  /// all-reduce, the largest of a chunk's level calls (a reduce, broadcast, reduce_scatter or
  /// all_gather of at most a chunk needs no more room).
  template <class T>
  [[nodiscard]] std::size_t chunk_elements() const {
    return detail::two_level_chunk_elements(
        opt_.chunk_bytes, sizeof(T),
        std::min(detail::level_max_count(intra_, collective::all_reduce, sizeof(T)),
                 detail::level_max_count(inter_, collective::all_reduce, sizeof(T))));
  }
  /// The uniform paths' chunk (detail::two_level_uniform_chunk of chunk_elements()).
  template <class T>
  [[nodiscard]] std::size_t uniform_chunk() const {
    return detail::two_level_uniform_chunk(chunk_elements<T>(),
                                           to_size(layout_.min_ranks_per_node()), sizeof(T));
  }
  /// call(first, len) over [0, count) by the largest pieces that one call of c on `level` takes:
  /// the paths on one level (one node, or one rank per node), where nothing pipelines. For
  /// reduce_scatter and all_gather, count is one rank block, and a piece is [first, first + len)
  /// of every block. One call (of nothing) where count is 0, as the level's own would be.
  template <class T, class Level, class F>
  static void by_level_calls(const Level& level, collective c, std::size_t count, F&& call) {
    const std::size_t piece =
        detail::two_level_chunk_elements(std::numeric_limits<std::size_t>::max(), sizeof(T),
                                         detail::level_max_count(level, c, sizeof(T)));
    const std::size_t pieces = std::max<std::size_t>(1, chunk_count(count, piece));
    for (std::size_t k = 0; k < pieces; ++k) {
      const auto [first, len] = chunk_span(k, piece, count);
      call(first, len);
    }
  }
  /// Whether the uniform paths' two whole calls of reduce_scatter or all_gather (c) of n elements
  /// a rank fit the levels: Intra's of N * n a rank block, Inter's of n.
  template <class T>
  [[nodiscard]] bool uniform_calls_fit(collective c, std::size_t n) const {
    return n <= detail::level_max_count(inter_, c, sizeof(T)) &&
           n <= detail::level_max_count(intra_, c, sizeof(T)) / to_size(layout_.nodes());
  }
  static std::size_t chunk_count(std::size_t count, std::size_t chunk) noexcept {
    return count == 0 ? 0
                      : 1 + (count - 1) / chunk; // no count + chunk - 1: chunk may be near SIZE_MAX
  }
  /// (first element, length) of chunk k.
  static std::pair<std::size_t, std::size_t> chunk_span(std::size_t k, std::size_t chunk,
                                                        std::size_t count) noexcept {
    const std::size_t first = k * chunk;
    return {first, std::min(chunk, count - first)};
  }
  /// [begin, end) of block j of a chunk of len elements of T (detail::two_level_block, m blocks).
  template <class T>
  [[nodiscard]] std::pair<std::size_t, std::size_t> block(std::size_t len, int j) const noexcept {
    const auto m = static_cast<std::size_t>(layout_.min_ranks_per_node());
    return detail::two_level_block(len, static_cast<std::size_t>(j), m, sizeof(T));
  }
  template <class A, class C, class T, class Op>
  static void run_all_reduce(C& comm, const T* in, T* out, std::size_t count, const Op& op) {
    if (in == out) {
      weft::all_reduce<A>(comm, std::span<T>(out, count), op);
    } else {
      weft::all_reduce<A>(comm, std::span<const T>(in, count), std::span<T>(out, count), op);
    }
  }

  std::shared_ptr<const void> held_; // first: released after the communicators that borrow it
  Intra intra_;
  Inter inter_;
  std::vector<int> node_of_;
  int rank_ = 0;
  two_level_options opt_;
  Runtime runtime_;
  detail::node_layout layout_; // nodes numbered by first rank, as the inter communicators rank them
  std::vector<int> node_first_; // by node: its first position in node-major order
  std::vector<int> pos_;        // world rank -> node-major position
  bool contiguous_ = true;      // node-major order is world order
  int local_ = 0;               // this rank's index on its node (Intra's rank)
  int color_ = 0; // this rank's node, numbered by first rank (the inter communicators' rank of it)
};

/// A two_level of one transport, split from `world` by its node_of(): Intra = the ranks of
/// this rank's node, Inter = the ranks of its local index. Collective over `world`.
template <communicator World, class Runtime = host_runtime>
two_level<World, World, Runtime> make_two_level(World& world, two_level_options opt = {},
                                                Runtime runtime = {}) {
  const std::vector<int> node_of = world.node_of();
  const int rank = world.rank();
  const int color = detail::node_color(node_of, rank);
  World intra = world.split(color, rank);
  World inter = world.split(intra.rank(), color);
  return two_level<World, World, Runtime>(std::move(intra), std::move(inter), node_of, rank, opt,
                                          std::move(runtime));
}

} // namespace weft
