#pragma once
// The owning matrix in device memory, weft::matrix<T, weft::device_space>, the counterpart of the
// host matrix of <weft/layer/matrix.hpp>: rows x cols, row-major, leading dimension = cols,
// zero-filled on creation. Its views (matrix_view<T>) hold device pointers: pass them to a device
// GEMM policy (weft::layer::cublas), never index them on the host. Copies to and from host views
// take any leading dimension (cudaMemcpy2D).
//
// Memory: a matrix made or grown on a stream takes stream-ordered memory on it (cudaMallocAsync,
// freed with cudaFreeAsync after the work queued there), so that a layer that frees and makes
// its activations every step (release() under full recompute, a pipeline's stash) neither waits
// for the device nor blocks a collective overlapping on another stream; use such a matrix on
// that stream (or after it), and let it go before the stream. On the default stream (nullptr)
// it is cudaMalloc'd and cudaFree'd, which waits for the device.
//
//   weft::matrix<float, weft::device_space> d = weft::to_device(host.view());
//   gemm(trans::n, trans::t, 1.0f, d_x.cview(), d_w.cview(), 0.0f, d_y.view());
//   weft::matrix<float> back = weft::to_host(d_y);
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/layer/matrix.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

namespace weft {

template <class T>
class matrix<T, device_space> {
public:
  using value_type = T;
  using space = device_space;

  matrix() = default;
  matrix(std::size_t rows, std::size_t cols, cudaStream_t s = nullptr) { resize(rows, cols, s); }

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] T* data() const noexcept {
    return ordered_.data() != nullptr ? ordered_.data() : plain_.data();
  }

  [[nodiscard]] matrix_view<T> view() noexcept { return {data(), rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> view() const noexcept { return {data(), rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> cview() const noexcept { return view(); }
  operator matrix_view<T>() noexcept { return view(); }             // NOLINT: views are cheap
  operator matrix_view<const T>() const noexcept { return view(); } // NOLINT

  /// Reshape to rows x cols, zero-filled (stream-ordered on s); reallocates only to grow, in
  /// stream-ordered memory on s unless s is the default stream (see the header).
  void resize(std::size_t rows, std::size_t cols, cudaStream_t s = nullptr) {
    const std::size_t n = rows * cols;
    if (n > std::max(ordered_.size(), plain_.size())) {
      if (s != nullptr) {
        plain_ = {};
        ordered_ = cuda::stream_buffer<T>(n, s); // the old block is freed on its own stream
      } else {
        ordered_ = {};
        plain_ = cuda::device_buffer<T>(n);
      }
    }
    rows_ = rows;
    cols_ = cols;
    if (n != 0) WEFT_CUDA_TRY(cudaMemsetAsync(data(), 0, n * sizeof(T), s));
  }

  /// This matrix = the host view (reshaped to its shape), any leading dimension. Synchronous
  /// with respect to the host when s is the default stream.
  void copy_from(matrix_view<const T> host, cudaStream_t s = nullptr) {
    if (rows_ != host.rows() || cols_ != host.cols()) resize(host.rows(), host.cols(), s);
    if (size() == 0) return;
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(data(), cols_ * sizeof(T), host.data(), host.ld() * sizeof(T),
                                    cols_ * sizeof(T), rows_, cudaMemcpyHostToDevice, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }
  /// The host view = this matrix (same shape required), any leading dimension; waits for s.
  void copy_to(matrix_view<T> host, cudaStream_t s = nullptr) const {
    expect_shape("matrix<device_space>::copy_to", "host view", host, rows_, cols_);
    if (size() == 0) return;
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(host.data(), host.ld() * sizeof(T), data(), cols_ * sizeof(T),
                                    cols_ * sizeof(T), rows_, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }

private:
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  cuda::stream_buffer<T> ordered_; // made on a stream
  cuda::device_buffer<T> plain_;   // made on the default stream
};

template <class T>
using device_matrix = matrix<T, device_space>;

/// A device copy of a host view.
template <class T>
[[nodiscard]] matrix<std::remove_const_t<T>, device_space> to_device(matrix_view<T> host,
                                                                     cudaStream_t s = nullptr) {
  using U = std::remove_const_t<T>;
  matrix<U, device_space> d;
  d.copy_from(matrix_view<const U>(host.data(), host.rows(), host.cols(), host.ld()), s);
  return d;
}

/// A host copy of a device matrix.
template <class T>
[[nodiscard]] matrix<T> to_host(const matrix<T, device_space>& d, cudaStream_t s = nullptr) {
  matrix<T> h(d.rows(), d.cols());
  d.copy_to(h.view(), s);
  return h;
}

} // namespace weft
