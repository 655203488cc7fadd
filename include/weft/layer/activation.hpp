#pragma once
// The MLPs' activations, forward and backward, elementwise on matrix views (on the host; with a
// GEMM policy, where the policy works: exec.hpp).
//
// GELU, the tanh approximation (as GPT-2 and Megatron use it):
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// evaluated, in T, through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)):
// one exp instead of a tanh, four times faster in float (the GELU of a 4h-wide MLP otherwise
// costs as much as one of its GEMMs), and exact at both ends (exp overflowing gives 0, not NaN).
//
// SiLU (swish, the gate of Llama's SwiGLU MLP), with sigmoid(x) = 1 / (1 + exp(-x)):
//   silu(x)  = x sigmoid(x)
//   silu'(x) = sigmoid(x) + x sigmoid(x) (1 - sigmoid(x))
// in T, with 1 - sigmoid taken as exp(-x) sigmoid(x), which does not cancel where sigmoid
// is near 1.
//
//   weft::layer::silu_forward<float>(x, y.view());
//   weft::layer::silu_backward<float>(x, dy, dx.view());
#include <weft/core/config.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/matrix.hpp>

#include <cmath>
#include <cstddef>
#include <string_view>

namespace weft::layer {

namespace detail {

template <class T>
struct gelu_terms {
  T sig;     // 0.5 (1 + tanh(u)) = 1 / (1 + e)
  T one_sig; // 1 - sig = e / (1 + e), without the cancellation of 1 - sig where sig is near 1
  T du;      // du/dx
};

template <class T>
WEFT_HOST_DEVICE gelu_terms<T> gelu_eval(T x) {
  const T s = static_cast<T>(0.79788456080286535588); // sqrt(2 / pi)
  const T k = static_cast<T>(0.044715);
  const T u = s * (x + k * x * x * x);
  const T e = std::exp(T{-2} * u);
  const T sig = T{1} / (T{1} + e);
  return {sig, std::isinf(e) ? T{1} : e * sig, s * (T{1} + T{3} * k * x * x)};
}

template <class T>
WEFT_HOST_DEVICE T gelu(T x) {
  return x * gelu_eval(x).sig;
}
// 0.5 x (1 - tanh^2) = 2 x sig (1 - sig).
template <class T>
WEFT_HOST_DEVICE T gelu_grad(T x) {
  const auto [sig, one_sig, du] = gelu_eval(x);
  return sig + T{2} * x * sig * one_sig * du;
}

template <class T>
struct gelu_forward_op {
  matrix_view<const T> x;
  matrix_view<T> y;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { y(r, c) = gelu(x(r, c)); }
};

template <class T>
struct gelu_backward_op {
  matrix_view<const T> x;
  matrix_view<const T> dy;
  matrix_view<T> dx;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    dx(r, c) = dy(r, c) * gelu_grad(x(r, c));
  }
};

template <class T>
struct silu_terms {
  T sig;     // sigmoid(x) = 1 / (1 + e), e = exp(-x)
  T one_sig; // 1 - sig = e sig (1 where e overflows, as sig is 0 there)
};

template <class T>
WEFT_HOST_DEVICE silu_terms<T> silu_eval(T x) {
  const T e = std::exp(-x);
  const T sig = T{1} / (T{1} + e);
  return {sig, std::isinf(e) ? T{1} : e * sig};
}

template <class T>
WEFT_HOST_DEVICE T silu(T x) {
  return x * silu_eval(x).sig;
}
template <class T>
WEFT_HOST_DEVICE T silu_grad(T x) {
  const auto [sig, one_sig] = silu_eval(x);
  return sig + x * sig * one_sig;
}

template <class T>
struct silu_forward_op {
  matrix_view<const T> x;
  matrix_view<T> y;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { y(r, c) = silu(x(r, c)); }
};

template <class T>
struct silu_backward_op {
  matrix_view<const T> x;
  matrix_view<const T> dy;
  matrix_view<T> dx;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    dx(r, c) = dy(r, c) * silu_grad(x(r, c));
  }
};

} // namespace detail

/// y = gelu(x), elementwise, where the policy works; y may be x.
template <class Exec, class T>
void gelu_forward(const Exec& exec, matrix_view<const T> x, matrix_view<T> y) {
  expect_shape("gelu_forward", "y", y, x.rows(), x.cols());
  detail::for_each_element(exec, x.rows(), x.cols(), detail::gelu_forward_op<T>{x, y});
}
template <class T>
void gelu_forward(matrix_view<const T> x, matrix_view<T> y) {
  gelu_forward(host_policy{}, x, y);
}

/// dx = dy * gelu'(x), elementwise, where the policy works; dx may be dy.
template <class Exec, class T>
void gelu_backward(const Exec& exec, matrix_view<const T> x, matrix_view<const T> dy,
                   matrix_view<T> dx) {
  expect_shape("gelu_backward", "dy", dy, x.rows(), x.cols());
  expect_shape("gelu_backward", "dx", dx, x.rows(), x.cols());
  detail::for_each_element(exec, x.rows(), x.cols(), detail::gelu_backward_op<T>{x, dy, dx});
}
template <class T>
void gelu_backward(matrix_view<const T> x, matrix_view<const T> dy, matrix_view<T> dx) {
  gelu_backward(host_policy{}, x, dy, dx);
}

/// y = silu(x), elementwise, where the policy works; y may be x.
template <class Exec, class T>
void silu_forward(const Exec& exec, matrix_view<const T> x, matrix_view<T> y) {
  expect_shape("silu_forward", "y", y, x.rows(), x.cols());
  detail::for_each_element(exec, x.rows(), x.cols(), detail::silu_forward_op<T>{x, y});
}
template <class T>
void silu_forward(matrix_view<const T> x, matrix_view<T> y) {
  silu_forward(host_policy{}, x, y);
}

/// dx = dy * silu'(x), elementwise, where the policy works; dx may be dy.
template <class Exec, class T>
void silu_backward(const Exec& exec, matrix_view<const T> x, matrix_view<const T> dy,
                   matrix_view<T> dx) {
  expect_shape("silu_backward", "dy", dy, x.rows(), x.cols());
  expect_shape("silu_backward", "dx", dx, x.rows(), x.cols());
  detail::for_each_element(exec, x.rows(), x.cols(), detail::silu_backward_op<T>{x, dy, dx});
}
template <class T>
void silu_backward(matrix_view<const T> x, matrix_view<const T> dy, matrix_view<T> dx) {
  silu_backward(host_policy{}, x, dy, dx);
}

} // namespace weft::layer
