#pragma once
// weft::optim::data_parallel on GPUs: the same class (every ZeRO stage, hybrid sharding,
// bucketed overlapped reduction, clipping, mixed precision, loss scaling), with its buffers in
// device memory, its element work as kernels and its collectives stream-ordered. Include this
// header and make the optimizer over a device communicator (cuda::nccl, cuda::p2p,
// cuda::emulated; a two_level is no communicator to split): param() and grad() then give
// device spans.
//
//   weft::cuda::nccl::communicator dp = ...;               // its stream: where the model runs
//   auto opt = weft::optim::make_data_parallel<weft::optim::zero<2>>(dp, ps, weft::optim::adamw{});
//   opt->set_parameters(initial);                          // host floats, copied to the device
//   auto w = opt->param("fc1.w");                          // device memory, ready on dp.stream()
//   my_backward<<<..., dp.stream()>>>(opt->grad("fc1.w").data(), ...);
//   opt->grad_ready("fc1.w");   // the bucket's reduction is queued on a side stream after the
//                               // kernels queued on dp.stream() so far; the host does not wait
//   opt->step(1.0f / global_batch);   // dp.stream() waits for the reductions, then the update
//
// Streams. The main stream is the data-parallel communicator's; everything the user queues
// there before grad_ready() is what the reduction reads. The collectives run in one order, a
// side stream's (options::overlap; without it the main stream's), handed to the split
// communicators' own streams and back by events. A wait on queued work is a wait of the main
// stream, never of the host; the host waits only where it reads a result: the global norm of a
// step that clips or scales the loss (one device-to-host copy), gather_parameters and
// set_parameters. Buffers are stream-ordered allocations (cudaMallocAsync / cudaFreeAsync).
// Checkpoints (optim/checkpoint.hpp) write and read a host copy of the shard that the optimizer
// takes when they ask for it and copies back on load: the files are the host path's.
//
// Transports. Over cuda::p2p every collective goes through the communicator's workspace (64 MiB
// by default), which the default bucket (4e7 elements) does not fit: set
// options::bucket_elements, or p2p::options::workspace_bytes, else the first reduction throws
// naming the bytes it needs; ranks sharing one device need p2p::configure_shared_device(), more
// so here, where each rank adds a side stream. The buffers come from weft's memory pool on the
// device (cuda::memory_pool), open to the devices that can reach it, since NCCL with several
// GPUs in one process (nccl::init_all) loads user buffers directly from peers.
#include <weft/cuda/async.cuh>
#include <weft/cuda/detail/fixed_order_sum.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/cuda/types.cuh>
#include <weft/optim/data_parallel.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace weft::cuda::detail {

/// A queued job (its collectives, in the side stream's order); waiting is the main stream's.
class dp_work {
public:
  dp_work() = default;
  dp_work(work w, cudaStream_t main) : w_(std::move(w)), main_(main) {}
  /// The main stream's later work runs after the job (the host does not wait).
  void wait() const { w_.wait(main_); }

private:
  work w_;
  cudaStream_t main_ = nullptr;
};

class dp_queue {
public:
  dp_queue(cudaStream_t main, cudaStream_t side) : order_(main, side) {}
  /// Queues f's work on the side stream after the main stream's work so far.
  template <class F>
  dp_work submit(F&& f) {
    return dp_work(work(order_.submit(std::forward<F>(f)), {}, "data_parallel", error::unknown),
                   order_.main());
  }

private:
  fork_join order_;
};

/// f(first + i): a launch over [first, first + n) of a functor indexed from 0.
template <class F>
struct dp_offset {
  F f;
  std::size_t first;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const { f(first + i); }
};

/// Threads of a block summing one piece of the norm's ranges.
inline constexpr unsigned dp_square_threads = 256;

/// partial[b] = the sum over range b of float(g)^2 in double: one block per range, each thread
/// striding over it in order, then the block's fixed tree (cub::BlockReduce, whose order depends
/// only on the block size).
template <class P>
__global__ void __launch_bounds__(dp_square_threads)
    dp_range_squares(const optim::detail::norm_range<P>* ranges, double* partial) {
  using block_sum = cub::BlockReduce<double, dp_square_threads>;
  __shared__ typename block_sum::TempStorage temp;
  const auto r = ranges[blockIdx.x];
  using D = device_type_t<P>;
  const D* g = reinterpret_cast<const D*>(r.data);
  double acc = 0.0;
  for (std::size_t i = threadIdx.x; i < r.n; i += dp_square_threads) {
    const auto v = static_cast<double>(static_cast<float>(g[i]));
    acc += v * v;
  }
  const double total = block_sum(temp).Sum(acc); // valid in thread 0
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

} // namespace weft::cuda::detail

namespace weft::optim::detail {

/// Device memory and streams, for a communicator with a stream (see the header comment).
template <class Comm>
requires streamed_communicator<Comm>
class dp_memory<Comm> {
public:
  static constexpr bool on_device = true;
  template <class T>
  using buffer = cuda::stream_buffer<T>;
  using queue = cuda::detail::dp_queue;
  using work = cuda::detail::dp_work;

  explicit dp_memory(Comm& dp) : main_(dp.stream()) {}
  dp_memory(const dp_memory&) = delete;
  dp_memory& operator=(const dp_memory&) = delete;

  /// A split queuing on a stream of its own where the transport can make one.
  [[nodiscard]] Comm split(Comm& c, int color, int key) {
    if constexpr (requires { c.split_with_stream(color, key); }) {
      return c.split_with_stream(color, key);
    } else {
      return c.split(color, key);
    }
  }
  [[nodiscard]] std::unique_ptr<queue> make_queue(bool overlap) {
    if (overlap) side_owned_.emplace();
    return std::make_unique<queue>(main_, side());
  }

  template <class T>
  void zeros(buffer<T>& b, std::size_t n, lane l) {
    b.allocate(n, stream_of(l));
    fill_zero(b.data(), n, l);
  }
  template <class T>
  void release(buffer<T>& b, lane l) {
    b.release(stream_of(l));
  }
  template <class T>
  void fill_zero(T* p, std::size_t n, lane l) {
    if (n != 0) WEFT_CUDA_TRY(cudaMemsetAsync(p, 0, n * sizeof(T), stream_of(l)));
  }
  template <class T>
  void copy(T* dst, const T* src, std::size_t n, lane l) {
    if (n != 0 && dst != src) {
      WEFT_CUDA_TRY(
          cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_of(l)));
    }
  }
  /// dst[i] += src[i], a kernel in l's stream.
  template <class T>
  void add(T* dst, const T* src, std::size_t n, lane l) {
    if (n != 0) cuda::reduce(dst, dst, src, n, op::sum{}, stream_of(l));
  }
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) {
    if (n == 0) return;
    WEFT_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, main_));
    WEFT_CUDA_TRY(cudaStreamSynchronize(main_)); // src is the caller's, pageable
  }
  template <class T>
  void download(T* dst, const T* src, std::size_t n) {
    if (n == 0) return;
    WEFT_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, main_));
    WEFT_CUDA_TRY(cudaStreamSynchronize(main_));
  }
  template <class Kernel, class G, class P>
  void update(const update_ref<Kernel, G, P>& u, std::size_t n, int) {
    cuda::detail::launch(u, n, main_);
  }
  /// A shard cut into runs of equal decay: one launch per run, with that run's functor (the
  /// runs are the host's, layout::decay_runs, the same ones the host loop walks).
  template <class Kernel, class G, class P>
  void update(const update_ref<decay_groups<Kernel>, G, P>& u, std::size_t, int) {
    u.k.for_each_run([&](const Kernel& k, std::size_t lo, std::size_t hi) {
      using run_ref = cuda::detail::dp_offset<update_ref<Kernel, G, P>>;
      cuda::detail::launch(run_ref{decay_groups<Kernel>::with(u, k), lo}, hi - lo, main_);
    });
  }
  /// The ranges cut into pieces of at most 64K elements (norm_pieces), in device memory, with
  /// room for the pieces' sums: made once (a blocking upload), used by every step that needs a
  /// norm.
  template <class P>
  struct squares {
    buffer<norm_range<P>> pieces;
    buffer<double> partial;
  };
  template <class P>
  squares<P> prepare_squares(const std::vector<norm_range<P>>& ranges) {
    const auto pieces = norm_pieces(ranges, std::size_t{1} << 16);
    squares<P> s;
    s.pieces.allocate(pieces.size(), main_);
    s.partial.allocate(pieces.size(), main_);
    upload(s.pieces.data(), pieces.data(), pieces.size());
    return s;
  }
  /// One block per piece (a large tensor spreads over the device), then one block adds the
  /// pieces' sums in parallel, in an order fixed by their count (fixed_order_sum): the same bits
  /// on every run, however the blocks are scheduled, and nothing allocated per step.
  template <class P>
  void sum_squares(const squares<P>& s, double* out) {
    const std::size_t n = s.pieces.size();
    if (n == 0) {
      WEFT_CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(double), main_));
      return;
    }
    cuda::detail::dp_range_squares<P>
        <<<static_cast<unsigned>(n), cuda::detail::dp_square_threads, 0, main_>>>(s.pieces.data(),
                                                                                  s.partial.data());
    WEFT_CUDA_TRY(cudaGetLastError());
    cuda::detail::fixed_order_sum(cuda::detail::load_term{s.partial.data()}, n, out, main_);
  }
  /// f(c) in the side stream's order: c's stream waits for the side stream, and the side
  /// stream for what f queued there.
  template <class F>
  void run(Comm& c, F&& f) {
    const cudaStream_t cs = c.stream();
    if (cs != side()) {
      hop_.record(side());
      WEFT_CUDA_TRY(cudaStreamWaitEvent(cs, hop_.get(), 0));
    }
    std::forward<F>(f)(c);
    if (cs != side()) {
      hop_.record(cs);
      WEFT_CUDA_TRY(cudaStreamWaitEvent(side(), hop_.get(), 0));
    }
  }
  void synchronize() {
    WEFT_CUDA_TRY(cudaStreamSynchronize(side()));
    WEFT_CUDA_TRY(cudaStreamSynchronize(main_));
  }

private:
  [[nodiscard]] cudaStream_t side() const noexcept {
    return side_owned_ ? side_owned_->get() : main_;
  }
  [[nodiscard]] cudaStream_t stream_of(lane l) const noexcept {
    return l == lane::main ? main_ : side();
  }

  cudaStream_t main_;
  std::optional<cuda::stream> side_owned_;
  cuda::event hop_;
};

} // namespace weft::optim::detail
