#pragma once
// A sum of n terms on the device, in parallel, in an order fixed by n alone: one block of
// fixed_sum_threads threads, thread t adding terms t, t + fixed_sum_threads, ... in order, then
// cub::BlockReduce's tree over the threads (its order depends only on the block size). So every
// run gives the same bits, on any device, however the work is scheduled. cub::DeviceReduce
// promises that only per device ("run-to-run" determinism on the same GPU: CUB's DeviceReduce
// documentation), since its grid follows the SM count; its kernels' template arguments also name
// ::cuda types, which nvcc's host stubs spell unqualified, so a translation unit with
// `using namespace weft;` at file scope (where weft::cuda is) would not compile.
//
// For sums of a few thousand to a few hundred thousand terms (a norm's per-block partials, a
// loss's per-token terms): one block reads them at a fraction of the device's bandwidth.
#include <weft/cuda/error.cuh>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cstddef>

namespace weft::cuda::detail {

inline constexpr unsigned fixed_sum_threads = 1024;

/// *out = term(0) + ... + term(n - 1) in double, in the order above; term(i) is a double.
template <class Term, unsigned Threads = fixed_sum_threads>
__global__ void __launch_bounds__(Threads)
    fixed_order_sum_kernel(Term term, std::size_t n, double* out) {
  using block_sum = cub::BlockReduce<double, Threads>;
  __shared__ typename block_sum::TempStorage temp;
  double acc = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += Threads)
    acc += term(i);
  const double total = block_sum(temp).Sum(acc); // valid in thread 0
  if (threadIdx.x == 0) *out = total;
}

/// Queues *out = the sum of term(i) for i < n (0 for none) on s.
template <class Term>
void fixed_order_sum(const Term& term, std::size_t n, double* out, cudaStream_t s) {
  fixed_order_sum_kernel<Term><<<1, fixed_sum_threads, 0, s>>>(term, n, out);
  WEFT_CUDA_TRY(cudaGetLastError());
}

/// term(i) = p[i].
struct load_term {
  const double* p;
  __device__ double operator()(std::size_t i) const { return p[i]; }
};

} // namespace weft::cuda::detail
