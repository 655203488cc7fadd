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
// a pipeline, chunk k+1's reduce before chunk k's broadcast; on GPUs Intra and Inter run on
// their own streams, ordered by events (Handoff, weft::cuda::stream_handoff), so the inter-node
// all-reduce of one chunk overlaps the intra-node reduce of the next. One node: Intra's
// all-reduce; one rank per node: Inter's.
//
// Every element is reduced at one place by Intra, then by Inter's all-reduce (bitwise equal on
// every leader with weft's plans), then only copied: every rank ends with the same bits.
// op::avg sums and divides once, by the whole group's size. The call's buffers are the
// transports' own (device memory for device transports); the call is queued on Intra's stream
// and returns when queued there, as the transports' calls do.
//
// Algorithms: algo::stages<IntraAlgo, InterAlgo> names each level's (IntraAlgo must plan
// reduce and broadcast: ring, tree, direct, automatic; InterAlgo all_reduce, or vendor for the
// transport's own). The default, stages<>, is automatic at both levels.
//
// Ranks are numbered as the world they were split from; rank(), size(), node_of() are the
// world's. A two_level is not itself split again: split the world, then make one from that.
// Collectives offered: all_reduce and barrier (the others: use Intra or Inter, or a world
// communicator of one transport with hierarchical<>).
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft {

namespace algo {

/// two_level's algorithm: IntraAlgo for the reduce and broadcast inside each node, InterAlgo
/// for the all-reduce across nodes.
template <class IntraAlgo = automatic, class InterAlgo = automatic>
struct stages {
  using intra = IntraAlgo;
  using inter = InterAlgo;
  static constexpr std::string_view name = "stages";
  static constexpr bool serves(collective c) { return c == collective::all_reduce; }
};

template <class A>
inline constexpr bool is_stages_v = false;
template <class I, class O>
inline constexpr bool is_stages_v<stages<I, O>> = true;

} // namespace algo

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
};

struct two_level_options {
  /// Bytes of each pipelined chunk of an all-reduce (the last may be shorter).
  std::size_t chunk_bytes = std::size_t{4} << 20;
};

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
    // Ranks per node, and this rank's local index, from node_of.
    std::map<int, int> per_node;
    int local = 0;
    for (int r = 0; r < size; ++r) {
      if (r < rank_ && node_of_[static_cast<std::size_t>(r)] == node_of_[static_cast<std::size_t>(rank_)]) ++local;
      ++per_node[node_of_[static_cast<std::size_t>(r)]];
    }
    nodes_ = static_cast<int>(per_node.size());
    leaders_ = size;
    int with_local = 0;  // nodes that have a rank of this local index
    for (const auto& [node, n] : per_node) {
      leaders_ = std::min(leaders_, n);
      if (n > local) ++with_local;
    }
    const int mine = per_node[node_of_[static_cast<std::size_t>(rank_)]];
    if (intra_.size() != mine || intra_.rank() != local) {
      throw error("two_level", rank_, error::unknown,
                  "the intra-node communicator has rank " + std::to_string(intra_.rank()) + " of " +
                      std::to_string(intra_.size()) + ", but node_of puts this rank at local index " +
                      std::to_string(local) + " of " + std::to_string(mine) + " ranks on its node");
    }
    if (inter_.size() != with_local) {
      throw error("two_level", rank_, error::unknown,
                  "the inter-node communicator has " + std::to_string(inter_.size()) + " ranks, but " +
                      std::to_string(with_local) + " nodes have a rank of local index " + std::to_string(local));
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

  /// Every rank of the world has reached it: the node's ranks, then the first rank of each node.
  void barrier() {
    intra_.barrier();
    if (intra_.rank() == 0) inter_.barrier();
    intra_.barrier();
  }

  template <class Algo, class T, class Op>
  void all_reduce(const T* in, T* out, std::size_t count, const Op& op) {
    static_assert(algo::is_stages_v<Algo>,
                  "weft::two_level: name each level's algorithm with algo::stages<IntraAlgo, InterAlgo>, e.g. "
                  "stages<algo::direct, algo::vendor>; the default stages<> is automatic at both");
    using IA = typename Algo::intra;
    using OA = typename Algo::inter;
    if (nodes_ == 1) {
      run_all_reduce<IA>(intra_, in, out, count, op);
      return;
    }
    if (nodes_ == size()) {  // one rank per node
      run_all_reduce<OA>(inter_, in, out, count, op);
      return;
    }
    if (count == 0) return;
    constexpr bool average = is_average_v<Op>;
    using stage_op = std::conditional_t<average, op::sum, Op>;
    const stage_op sop = stage_op(op);
    const std::size_t chunk = std::max<std::size_t>(1, opt_.chunk_bytes / sizeof(T));
    const std::size_t chunks = (count + chunk - 1) / chunk;
    const auto span_of = [&](std::size_t k) {
      const std::size_t first = k * chunk;
      return std::pair{first, std::min(chunk, count - first)};
    };
    const auto block = [&](std::size_t len, int j) {  // [begin, end) of block j of a chunk of len
      const auto m = static_cast<std::size_t>(leaders_);
      return std::pair{len * static_cast<std::size_t>(j) / m, len * static_cast<std::size_t>(j + 1) / m};
    };
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
      const auto [b, e] = block(len, intra_.rank());
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

private:
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
  int leaders_ = 1;
};

/// A two_level of one transport, split from `world` by its node_of(): Intra = the ranks of
/// this rank's node, Inter = the ranks of its local index. Collective over `world`.
template <communicator World, class Handoff = host_handoff>
two_level<World, World, Handoff> make_two_level(World& world, two_level_options opt = {}, Handoff handoff = {}) {
  const std::vector<int> node_of = world.node_of();
  const int rank = world.rank();
  const int node = node_of[static_cast<std::size_t>(rank)];
  // Node colors must be >= 0: number the nodes by their first rank.
  std::vector<int> first_of;
  int color = -1;
  for (int r = 0; r < world.size(); ++r) {
    const int n = node_of[static_cast<std::size_t>(r)];
    const bool seen = std::find(first_of.begin(), first_of.end(), n) != first_of.end();
    if (!seen) first_of.push_back(n);
    if (n == node && color < 0) color = static_cast<int>(std::find(first_of.begin(), first_of.end(), n) - first_of.begin());
  }
  World intra = world.split(color, rank);
  World inter = world.split(intra.rank(), color);
  return two_level<World, World, Handoff>(std::move(intra), std::move(inter), node_of, rank, opt, std::move(handoff));
}

template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, element T, class Op = op::sum>
  requires reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Handoff>& comm, std::span<T> inout, Op op = {}) {
  comm.template all_reduce<Algo>(inout.data(), inout.data(), inout.size(), op);
}

template <class Algo = algo::stages<>, class Intra, class Inter, class Handoff, class In, element T,
          class Op = op::sum>
  requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Handoff>& comm, std::span<In> in, std::span<T> out, Op op = {}) {
  detail::check_all_reduce_buffers(comm.rank(), in, out);
  comm.template all_reduce<Algo>(in.data(), out.data(), in.size(), op);
}

} // namespace weft
