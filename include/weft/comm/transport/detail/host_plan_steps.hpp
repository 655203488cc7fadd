#pragma once
// The hooks for run_plan (comm/plan/engine.hpp) that the host transports (local, MPI) share:
// a plan's copy and reduce steps, which run on this rank's own buffers in host memory. A
// transport's hooks derive from host_plan_steps and add the steps that move data between ranks.
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/engine.hpp>

#include <cstddef>

namespace weft::detail {

template <class T, class Op>
struct host_plan_steps : plan_hooks {
  const plan_buffers<T>& buffers;
  const Op& op;

  void copy(std::size_t, const step& s) {
    detail::copy_n(buffers.at(s.dst, s.dst_offset, s.count),
                   buffers.at(s.src, s.src_offset, s.count), s.count);
  }
  void reduce(std::size_t, const step& s) {
    T* d = buffers.at(s.dst, s.dst_offset, s.count);
    detail::reduce2(d, d, buffers.at(s.src, s.src_offset, s.count), s.count, op);
  }
};

} // namespace weft::detail
