#pragma once
// weft::cuda::two_level<Intra, Inter>: weft::two_level (comm/two_level.hpp) over device
// transports, each level on its own stream: Intra's (p2p or NCCL over NVLink) and Inter's (NCCL
// over InfiniBand). stream_runtime, the device runtime (comm/two_level/host_runtime.hpp says what a
// runtime does), orders them with an event, recorded on one stream and waited
// on by the other, so nothing waits on the host and chunk k's inter-node all-reduce runs while
// chunk k+1's intra-node reduce does. op::avg's divide is a kernel: all_reduce's on Inter's
// stream (each leader divides its block), the other collectives' on Intra's; on half, each
// input is scaled by 1/size first instead (a kernel on Intra's stream), as on every transport.
// A call's scratch (reduce's, the reordering of interleaved or uniform nodes) is stream-ordered
// device memory.
//
//   weft::cuda::emulated::run(weft::topology::parse("2x4"),
//                             [&](weft::cuda::emulated::communicator& world) {
//     auto tl = weft::make_two_level(world, {}, weft::cuda::stream_runtime{});
//     weft::all_reduce(tl, std::span(d_grad, n));   // queued on tl.stream() (the intra level's)
//   });
//   // p2p + NCCL (cuda/two_level_mpi.cuh)
//   auto tl = weft::cuda::two_level_from_mpi(MPI_COMM_WORLD);
//
// Each step runs with its stream's device current (a thread may drive ranks on several devices),
// and the event is made there on first use. A stream_runtime is shared by the copies of its
// two_level.
#include <weft/comm/two_level.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>

namespace weft::cuda {

/// weft::two_level's runtime on GPUs: each level on its own stream, ordered by an event; working
/// memory stream-ordered on the device; copies and op::avg's division queued on a stream.
class stream_runtime {
public:
  /// Work queued on `to` from now on waits for the work queued on `from` so far.
  template <class From, class To>
  void operator()(From& from, To& to) {
    const cudaStream_t a = from.stream();
    const cudaStream_t b = to.stream();
    if (a == b) return; // one stream: in order already
    const detail::device_scope on(detail::stream_device(a));
    if (!event_) event_ = std::make_shared<event>();
    event_->record(a);
    WEFT_CUDA_TRY(cudaStreamWaitEvent(b, event_->get(), 0));
  }
  /// data /= ranks, a kernel on comm's stream (op::avg's last step).
  template <class Comm, class T>
  void divide(Comm& comm, T* data, std::size_t n, int ranks) {
    const detail::device_scope on(detail::stream_device(comm.stream()));
    cuda::divide(data, n, ranks, comm.stream());
  }
  /// n elements of device memory, allocated and freed in the order of comm's stream
  /// (cudaMallocAsync / cudaFreeAsync): a call's scratch, used on either level's stream.
  template <class T, class Comm>
  stream_buffer<T> scratch(Comm& comm, std::size_t n) {
    const detail::device_scope on(detail::stream_device(comm.stream()));
    return stream_buffer<T>(n, comm.stream());
  }
  /// op::avg's first step on half: in's n elements times 1/ranks, a kernel on comm's stream, in
  /// memory of the call (as scratch's).
  template <class Comm, class T>
  stream_buffer<T> scaled_by_ranks(Comm& comm, const T* in, std::size_t n, int ranks) {
    const detail::device_scope on(detail::stream_device(comm.stream()));
    return cuda::scaled_by_ranks(in, n, ranks, comm.stream());
  }
  /// dst[0, n) = src[0, n), a device copy on comm's stream.
  template <class Comm, class T>
  void copy(Comm& comm, T* dst, const T* src, std::size_t n) {
    if (n == 0) return;
    const detail::device_scope on(detail::stream_device(comm.stream()));
    WEFT_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDefault, comm.stream()));
  }

  /// rows x n elements, row i from src + i * src_stride to dst + i * dst_stride: one 2D copy
  /// on comm's stream (row by row where a pitch is beyond what cudaMemcpy2DAsync takes).
  template <class Comm, class T>
  void copy_rows(Comm& comm, T* dst, std::size_t dst_stride, const T* src, std::size_t src_stride,
                 std::size_t n, std::size_t rows) {
    if (n == 0 || rows == 0) return;
    const detail::device_scope on(detail::stream_device(comm.stream()));
    constexpr std::size_t max_pitch = std::size_t{1}
                                      << 30; // under every device's memPitch (2^31 - 1)
    if (std::max(dst_stride, src_stride) * sizeof(T) <= max_pitch) {
      WEFT_CUDA_TRY(cudaMemcpy2DAsync(dst, dst_stride * sizeof(T), src, src_stride * sizeof(T),
                                      n * sizeof(T), rows, cudaMemcpyDefault, comm.stream()));
      return;
    }
    for (std::size_t i = 0; i < rows; ++i)
      copy(comm, dst + i * dst_stride, src + i * src_stride, n);
  }

private:
  // Recorded again for each handoff: a wait already queued keeps the record it was queued after.
  std::shared_ptr<event> event_;
};

template <class Intra, class Inter = Intra>
using two_level = weft::two_level<Intra, Inter, stream_runtime>;

using stream_handoff [[deprecated("use weft::cuda::stream_runtime")]] = stream_runtime;

} // namespace weft::cuda
