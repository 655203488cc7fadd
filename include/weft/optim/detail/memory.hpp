#pragma once
// Where data_parallel's buffers live and how its element work and collectives run, chosen by
// the communicator: host memory for the host transports (this file), device memory and
// streams for the CUDA ones (<weft/cuda/data_parallel.cuh> specializes dp_memory for any
// communicator with a stream()).
//
// data_parallel calls these with a lane: `main` is the caller's order (the host thread here;
// on a device, the data-parallel communicator's stream, where the user's forward and backward
// run), `side` the order of the queued collectives (the progress thread here; a side stream
// on a device). On the host both are plain loops on the calling thread.
#include <weft/comm/async.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/optim/optimizers.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace weft::optim::detail {

enum class lane { main, side };

/// n elements of a gradient shard counted in the global norm.
template <class P>
struct norm_range {
  const P* data;
  std::size_t n;
};

/// The ranges cut, in order, into pieces of at most `piece` elements (empty ranges give none): a
/// device sums each piece's squares in one block, then the pieces' sums in one fixed order, so a
/// large tensor spreads over the device and the result does not depend on how blocks are run.
template <class P>
[[nodiscard]] std::vector<norm_range<P>> norm_pieces(const std::vector<norm_range<P>>& ranges,
                                                     std::size_t piece) {
  WEFT_EXPECTS(piece > 0, "norm_pieces: the piece size must be positive");
  std::vector<norm_range<P>> pieces;
  for (const auto& r : ranges) {
    for (std::size_t at = 0; at < r.n; at += piece)
      pieces.push_back({r.data + at, std::min(piece, r.n - at)});
  }
  return pieces;
}

template <class Comm>
concept streamed_communicator = requires(const Comm& c) {
  c.stream();
};

/// Host memory: std::vector buffers, loops, and a progress thread for the collectives.
template <class Comm>
class dp_memory {
  static_assert(!streamed_communicator<Comm>,
                "weft::optim::data_parallel over a device communicator: include "
                "<weft/cuda/data_parallel.cuh>");

public:
  static constexpr bool on_device = false;
  template <class T>
  using buffer = std::vector<T>;
  using queue = progress_queue;
  using work = weft::work;

  dp_memory() = default;
  explicit dp_memory(Comm&) {}

  [[nodiscard]] Comm split(Comm& c, int color, int key) { return c.split(color, key); }
  [[nodiscard]] std::unique_ptr<queue> make_queue(bool overlap) {
    return std::make_unique<queue>(!overlap);
  }

  /// b = n zeros (a new allocation).
  template <class T>
  void zeros(buffer<T>& b, std::size_t n, lane) {
    b.assign(n, T(0.0f));
  }
  template <class T>
  void release(buffer<T>& b, lane) {
    buffer<T>().swap(b);
  }
  template <class T>
  void fill_zero(T* p, std::size_t n, lane) {
    std::fill_n(p, n, T(0.0f));
  }
  template <class T>
  void copy(T* dst, const T* src, std::size_t n, lane) {
    std::copy_n(src, n, dst);
  }
  /// dst[i] += src[i] (summed in T's accumulation type, rounded once).
  template <class T>
  void add(T* dst, const T* src, std::size_t n, lane) {
    weft::detail::reduce2(dst, dst, src, n, op::sum{});
  }
  /// dst (this memory) = the host array src; src may go once it returns.
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  /// The host array dst = src (this memory), after the main lane's work so far.
  template <class T>
  void download(T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  template <class Kernel, class G, class P>
  void update(const update_ref<Kernel, G, P>& u, std::size_t n, int threads) {
    apply_parallel(u, n, threads);
  }
  /// The ranges a sum of squares runs over, kept from one step to the next.
  template <class P>
  using squares = std::vector<norm_range<P>>;
  template <class P>
  squares<P> prepare_squares(std::vector<norm_range<P>> ranges) {
    return ranges;
  }
  /// *out = the sum over the ranges, in order, of float(g)^2, accumulated in double (exact for
  /// integer-valued gradients).
  template <class P>
  void sum_squares(const squares<P>& ranges, double* out) {
    double sq = 0.0;
    for (const auto& r : ranges) {
      for (std::size_t i = 0; i < r.n; ++i) {
        const auto v = static_cast<double>(static_cast<float>(r.data[i]));
        sq += v * v;
      }
    }
    *out = sq;
  }
  /// f(c) inside a queued job, in the side lane's order.
  template <class F>
  void run(Comm& c, F&& f) {
    std::forward<F>(f)(c);
  }
  /// Waits for everything queued on either lane (nothing to wait for here).
  void synchronize() {}
};

} // namespace weft::optim::detail
