#pragma once
// The owning matrix in device memory, weft::matrix<T, weft::device_space>, the counterpart of the
// host matrix of <weft/layer/matrix.hpp>: rows x cols, row-major, leading dimension = cols,
// zero-filled on creation. Its views (matrix_view<T>) hold device pointers: pass them to a device
// GEMM policy (weft::layer::cublas), never index them on the host. Copies to and from host views
// take any leading dimension (cudaMemcpy2D).
//
//   weft::matrix<float, weft::device_space> d = weft::to_device(host.view());
//   gemm(trans::n, trans::t, 1.0f, d_x.cview(), d_w.cview(), 0.0f, d_y.view());
//   weft::matrix<float> back = weft::to_host(d_y);
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/layer/matrix.hpp>

#include <cuda_runtime.h>

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
  [[nodiscard]] T* data() const noexcept { return buf_.data(); }

  [[nodiscard]] matrix_view<T> view() noexcept { return {buf_.data(), rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> view() const noexcept { return {buf_.data(), rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> cview() const noexcept { return view(); }
  operator matrix_view<T>() noexcept { return view(); }              // NOLINT: views are cheap
  operator matrix_view<const T>() const noexcept { return view(); }  // NOLINT

  /// Reshape to rows x cols, zero-filled (stream-ordered on s); reallocates only to grow.
  void resize(std::size_t rows, std::size_t cols, cudaStream_t s = nullptr) {
    if (rows * cols > buf_.size()) buf_ = cuda::device_buffer<T>(rows * cols);
    rows_ = rows;
    cols_ = cols;
    if (rows * cols != 0) WEFT_CUDA_TRY(cudaMemsetAsync(buf_.data(), 0, rows * cols * sizeof(T), s));
  }

  /// This matrix = the host view (reshaped to its shape), any leading dimension. Synchronous
  /// with respect to the host when s is the default stream.
  void copy_from(matrix_view<const T> host, cudaStream_t s = nullptr) {
    if (rows_ != host.rows() || cols_ != host.cols()) resize(host.rows(), host.cols(), s);
    if (size() == 0) return;
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(buf_.data(), cols_ * sizeof(T), host.data(), host.ld() * sizeof(T),
                                    cols_ * sizeof(T), rows_, cudaMemcpyHostToDevice, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }
  /// The host view = this matrix (same shape required), any leading dimension; waits for s.
  void copy_to(matrix_view<T> host, cudaStream_t s = nullptr) const {
    expect_shape("matrix<device_space>::copy_to", "host view", host, rows_, cols_);
    if (size() == 0) return;
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(host.data(), host.ld() * sizeof(T), buf_.data(), cols_ * sizeof(T),
                                    cols_ * sizeof(T), rows_, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }

private:
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  cuda::device_buffer<T> buf_;
};

template <class T>
using device_matrix = matrix<T, device_space>;

/// A device copy of a host view.
template <class T>
[[nodiscard]] matrix<std::remove_const_t<T>, device_space> to_device(matrix_view<T> host, cudaStream_t s = nullptr) {
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
