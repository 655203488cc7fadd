#pragma once
// The device GEMM policy: cuBLAS on row-major views of device memory, on the policy's stream.
//
//   weft::layer::cublas gemm(stream.get());                     // own handle, bound to the stream
//   gemm(trans::n, trans::t, 1.0f, x, w, 0.0f, y);              // y = x w^T, all device views
//
// cuBLAS is column-major, and a row-major m x n matrix with leading dimension ld is the column-
// major n x m matrix (its transpose) with the same ld. So C = op(A) op(B) in row-major is
// C^T = op(B)^T op(A)^T in column-major: one cublas<t>gemm with the operands swapped, the same
// transpose flags, and m and n exchanged. No copy, no transpose kernel.
//
// The layers built on it (linear.hpp, mlp.hpp) keep everything in device memory and queue their
// element-wise kernels on the same stream (exec.hpp); make it with the communicator's stream.
//
// Copies of the policy share one handle (layers take the policy by value). Float uses the
// default math mode (full FP32: no TF32 unless allow_tf32 is set, since the layers promise
// float results within 1e-5 of the reference). Calls are asynchronous on the stream.
#include <weft/core/error.hpp>
#include <weft/cuda/detail/fixed_order_sum.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/cuda/token_ids.cuh> // the embedding's ids on the device
#include <weft/layer/exec.hpp>
#include <weft/layer/gemm.hpp>
#include <weft/layer/matrix.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <concepts>
#include <memory>
#include <string>

namespace weft::layer::detail {

[[noreturn]] WEFT_COLD inline void throw_cublas(cublasStatus_t s, const char* call,
                                                const char* file, int line) {
  throw weft::error(cuda::detail::describe_failure(
      call, file, line,
      std::string(cublasGetStatusName(s)) + " (" + cublasGetStatusString(s) + ")"));
}

} // namespace weft::layer::detail

/// Runs a cuBLAS call; on failure throws weft::error naming the call, file:line and the status.
#define WEFT_CUBLAS_TRY(call)                                                                      \
  do {                                                                                             \
    const cublasStatus_t weft_cublas_status_ = (call);                                             \
    if (weft_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                            \
      ::weft::layer::detail::throw_cublas(weft_cublas_status_, #call, __FILE__, __LINE__);         \
    }                                                                                              \
  } while (false)

namespace weft::layer {

class cublas {
public:
  /// The layers keep their weights and activations in device memory and run their element-wise
  /// work as kernels on stream() (exec.hpp).
  using space = device_space;

  /// A new handle on the current device, on the default stream.
  cublas() : cublas(nullptr) {}
  /// allow_tf32: float GEMMs on tensor cores in TF32 (about 1e-3 relative error).
  explicit cublas(cudaStream_t stream, bool allow_tf32 = false)
      : state_(std::make_shared<state>()) {
    WEFT_CUBLAS_TRY(cublasCreate(&state_->handle));
    WEFT_CUBLAS_TRY(cublasSetStream(state_->handle, stream));
    WEFT_CUBLAS_TRY(cublasSetMathMode(
        state_->handle, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    state_->stream = stream;
  }

  [[nodiscard]] cublasHandle_t handle() const noexcept { return state_->handle; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return state_->stream; }

  /// C = alpha op(A) op(B) + beta C on row-major device views (beta == 0: C's old contents, NaN
  /// included, are ignored).
  template <class T>
  requires std::same_as<T, float> || std::same_as<T, double>
  void operator()(trans ta, trans tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
                  T beta, matrix_view<T> c) const {
    const auto [m, n, k] = detail::check_gemm("cublas", ta, tb, a, b, c);
    if (m == 0 || n == 0) return;
    const int ldc = ld_of(c.rows(), c.ld(), c.cols(), "ldc");
    const int mi = to_int(m, "m");
    const int ni = to_int(n, "n");
    if (k == 0) { // C = beta C, as the BLAS definition has it (beta == 0: zeros)
      if (beta == T{}) {
        WEFT_CUDA_TRY(cudaMemset2DAsync(c.data(), static_cast<std::size_t>(ldc) * sizeof(T), 0,
                                        n * sizeof(T), m, state_->stream));
      } else {
        const T zero{};
        if constexpr (std::same_as<T, float>) {
          WEFT_CUBLAS_TRY(cublasSgeam(state_->handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, &beta,
                                      c.data(), ldc, &zero, c.data(), ldc, c.data(), ldc));
        } else {
          WEFT_CUBLAS_TRY(cublasDgeam(state_->handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, &beta,
                                      c.data(), ldc, &zero, c.data(), ldc, c.data(), ldc));
        }
      }
      return;
    }
    const int lda = ld_of(a.rows(), a.ld(), a.cols(), "lda");
    const int ldb = ld_of(b.rows(), b.ld(), b.cols(), "ldb");
    const int ki = to_int(k, "k");
    const cublasOperation_t op_a = ta == trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op_b = tb == trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;
    // Column-major: C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m).
    if constexpr (std::same_as<T, float>) {
      WEFT_CUBLAS_TRY(cublasSgemm(state_->handle, op_b, op_a, ni, mi, ki, &alpha, b.data(), ldb,
                                  a.data(), lda, &beta, c.data(), ldc));
    } else {
      WEFT_CUBLAS_TRY(cublasDgemm(state_->handle, op_b, op_a, ni, mi, ki, &alpha, b.data(), ldb,
                                  a.data(), lda, &beta, c.data(), ldc));
    }
  }

  /// gemm_strided_batched (gemm.hpp) in one cuBLAS call: count GEMMs of one shape, operand i
  /// i * strides elements from the first.
  template <class T>
  requires std::same_as<T, float> || std::same_as<T, double>
  void strided_batched(std::size_t count, gemm_strides s, trans ta, trans tb, T alpha,
                       matrix_view<const T> a, matrix_view<const T> b, T beta,
                       matrix_view<T> c) const {
    const auto [m, n, k] = detail::check_gemm("cublas", ta, tb, a, b, c);
    if (count == 0 || m == 0 || n == 0) return;
    if (count == 1 || k == 0) { // one GEMM, or C = beta C: operator() has both
      for (std::size_t i = 0; i < count; ++i)
        (*this)(ta, tb, alpha, a.shifted(i * s.a), b.shifted(i * s.b), beta, c.shifted(i * s.c));
      return;
    }
    const int lda = ld_of(a.rows(), a.ld(), a.cols(), "lda");
    const int ldb = ld_of(b.rows(), b.ld(), b.cols(), "ldb");
    const int ldc = ld_of(c.rows(), c.ld(), c.cols(), "ldc");
    const int mi = to_int(m, "m");
    const int ni = to_int(n, "n");
    const int ki = to_int(k, "k");
    const int batch = to_int(count, "batch count");
    const auto stride = [](std::size_t x) { return static_cast<long long>(x); };
    const cublasOperation_t op_a = ta == trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t op_b = tb == trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;
    // As operator(): column-major C_i^T = op(B_i)^T op(A_i)^T.
    if constexpr (std::same_as<T, float>) {
      WEFT_CUBLAS_TRY(cublasSgemmStridedBatched(
          state_->handle, op_b, op_a, ni, mi, ki, &alpha, b.data(), ldb, stride(s.b), a.data(), lda,
          stride(s.a), &beta, c.data(), ldc, stride(s.c), batch));
    } else {
      WEFT_CUBLAS_TRY(cublasDgemmStridedBatched(
          state_->handle, op_b, op_a, ni, mi, ki, &alpha, b.data(), ldb, stride(s.b), a.data(), lda,
          stride(s.a), &beta, c.data(), ldc, stride(s.c), batch));
    }
  }

private:
  struct state {
    cublasHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (handle != nullptr) (void)cublasDestroy(handle);
    }
  };

  static int to_int(std::size_t v, const char* what) {
    if (v > static_cast<std::size_t>(INT_MAX)) {
      throw error(std::string("cublas: ") + what + " = " + std::to_string(v) +
                  " exceeds cuBLAS's int range");
    }
    return static_cast<int>(v);
  }
  // A one-row view may have ld < cols; cuBLAS wants ld >= the row length (and >= 1).
  static int ld_of(std::size_t rows, std::size_t ld, std::size_t cols, const char* what) {
    return to_int(std::max<std::size_t>({rows <= 1 ? std::max(ld, cols) : ld, std::size_t{1}}),
                  what);
  }

  std::shared_ptr<state> state_;
};

static_assert(gemm_for<cublas, float> && gemm_for<cublas, double>);

namespace detail {

/// A layer's (row, column) functor over a flat index.
template <class F>
struct element_at {
  F f;
  std::size_t cols;
  __device__ void operator()(std::size_t i) const { f(i / cols, i % cols); }
};

} // namespace detail

/// The layers' element-wise work on the device (found by detail::for_each_element): one thread
/// per element, on the policy's stream.
template <class F>
void each_element(const cublas& g, std::size_t rows, std::size_t cols, const F& f) {
  cuda::detail::launch(detail::element_at<F>{f, cols}, rows * cols, g.stream());
}

/// The sum of term(i) over i < n on the device, in parallel, in an order fixed by n
/// (cuda/detail/fixed_order_sum.cuh), on the policy's stream; returns once the stream has
/// computed it (found by detail::sum_over).
template <class F>
[[nodiscard]] double sum_terms(const cublas& g, std::size_t n, const F& term) {
  if (n == 0) return 0.0;
  cuda::stream_buffer<double> out(1, g.stream());
  cuda::detail::fixed_order_sum(term, n, out.data(), g.stream());
  double total = 0.0;
  WEFT_CUDA_TRY(
      cudaMemcpyAsync(&total, out.data(), sizeof(double), cudaMemcpyDeviceToHost, g.stream()));
  WEFT_CUDA_TRY(cudaStreamSynchronize(g.stream()));
  return total;
}

} // namespace weft::layer
