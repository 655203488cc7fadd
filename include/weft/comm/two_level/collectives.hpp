#pragma once
// The collectives of weft::two_level: the free functions all_reduce, reduce_scatter,
// all_gather, broadcast and reduce, which check the call and reach the communicator's own.
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/two_level/chunked.hpp>
#include <weft/comm/two_level/communicator.hpp>
#include <weft/comm/two_level/host_runtime.hpp>
#include <weft/comm/two_level/levels.hpp>
#include <weft/comm/two_level/rank_blocks.hpp>
#include <weft/comm/two_level/uniform_nodes.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

namespace weft {

namespace detail {

template <class Comm>
void check_two_level_root(const Comm& comm, const char* what, int root) {
  if (root < 0 || root >= comm.size()) {
    throw error(what, comm.rank(), error::unknown,
                "root " + std::to_string(root) + " is not a rank of the two_level's " +
                    std::to_string(comm.size()) + " ranks");
  }
}

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
  template <class TL, class T>
  static auto scaled_by_ranks(TL& c, const T* in, std::size_t n) {
    return c.runtime_.scaled_by_ranks(c.intra_, in, n, c.size());
  }
};

/// Whether the runtime scales half averages itself (cuda::stream_runtime: a kernel on the intra
/// level's stream, into memory of the call).
template <class Runtime, class Intra, class T>
concept scales_by_ranks = requires(Runtime& rt, Intra& c, const T* in) {
  rt.scaled_by_ranks(c, in, std::size_t{}, 1);
};

/// half averages as the plain collectives do (op::avg): each input scaled by 1/ranks first (host
/// memory under host_runtime, the runtime's own where it scales_by_ranks), then summed, so that
/// a mean half holds does not overflow on the way.
template <class Runtime, class Intra, class T, class Op>
inline constexpr bool premultiplied_average =
    is_average_v<Op>&& std::is_same_v<std::remove_cv_t<T>, half> &&
    (std::is_same_v<Runtime, host_runtime> || scales_by_ranks<Runtime, Intra, T>);

/// call(input, op): with the n elements of `in` scaled by 1/ranks and op::sum where
/// premultiplied_average holds, else with `in` and `op` as given.
template <class Intra, class Inter, class Runtime, class T, class Op, class Call>
void premultiplying_averages(two_level<Intra, Inter, Runtime>& comm, const T* in, std::size_t n,
                             const Op& op, Call&& call) {
  if constexpr (!premultiplied_average<Runtime, Intra, T, Op>) {
    call(in, op);
  } else if constexpr (std::is_same_v<Runtime, host_runtime>) {
    const auto scaled = scaled_by_ranks(in, n, comm.size());
    call(static_cast<const T*>(scaled.data()), op::sum{});
  } else {
    const auto scaled = two_level_access::scaled_by_ranks(comm, in, n);
    call(static_cast<const T*>(scaled.data()), op::sum{});
  }
}

} // namespace detail

template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, element T,
          class Op = op::sum>
requires reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Runtime>& comm, std::span<T> inout, Op op = {}) {
  comm.template check_call<T, Op>(collective::all_reduce, inout.size(), 0);
  detail::premultiplying_averages(comm, inout.data(), inout.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::all_reduce<Algo>(comm, src, inout.data(), inout.size(), o);
  });
}

template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, class In, element T,
          class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void all_reduce(two_level<Intra, Inter, Runtime>& comm, std::span<In> in, std::span<T> out,
                Op op = {}) {
  detail::check_all_reduce_buffers(comm.rank(), in, out);
  comm.template check_call<T, Op>(collective::all_reduce, in.size(), 0);
  detail::premultiplying_averages(comm, in.data(), in.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::all_reduce<Algo>(comm, src, out.data(), in.size(), o);
  });
}

/// out (in.size() / size() elements) = the reduction of block rank() of every rank's in.
template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, class In, element T,
          class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce_scatter(two_level<Intra, Inter, Runtime>& comm, std::span<In> in, std::span<T> out,
                    Op op = {}) {
  detail::check_reduce_scatter_buffers(comm.rank(), comm.size(), in, out);
  comm.template check_call<T, Op>(collective::reduce_scatter, out.size(), 0);
  detail::premultiplying_averages(comm, in.data(), in.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::reduce_scatter<Algo>(comm, src, out.data(), out.size(), o);
  });
}

/// Block r of out (in.size() elements each) = rank r's in, on every rank.
template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, class In, element T>
requires std::same_as<std::remove_const_t<In>, T>
void all_gather(two_level<Intra, Inter, Runtime>& comm, std::span<In> in, std::span<T> out) {
  detail::check_all_gather_buffers(comm.rank(), comm.size(), in, out);
  comm.template check_call<T, op::sum>(collective::all_gather, in.size(), 0);
  detail::two_level_access::all_gather<Algo>(comm, in.data(), out.data(), in.size());
}

/// data from world rank `root` to every rank of the two_level.
template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, element T>
void broadcast(two_level<Intra, Inter, Runtime>& comm, std::span<T> data, int root) {
  detail::check_two_level_root(comm, "broadcast", root);
  comm.template check_call<T, op::sum>(collective::broadcast, data.size(), root);
  detail::two_level_access::broadcast<Algo>(comm, data.data(), data.size(), root);
}

/// out, at world rank `root` (other ranks' out is not touched and may be empty), = the
/// reduction over every rank's in.
template <class Algo = algo::levels<>, class Intra, class Inter, class Runtime, class In, element T,
          class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce(two_level<Intra, Inter, Runtime>& comm, std::span<In> in, std::span<T> out, int root,
            Op op = {}) {
  detail::check_two_level_root(comm, "reduce", root);
  detail::check_reduce_buffers(comm.rank(), comm.rank() == root, in, out);
  comm.template check_call<T, Op>(collective::reduce, in.size(), root);
  detail::premultiplying_averages(comm, in.data(), in.size(), op, [&](const T* src, auto o) {
    detail::two_level_access::reduce<Algo>(comm, src, out.data(), in.size(), root, o);
  });
}

} // namespace weft
