#pragma once
// The unsplit MLP (x -> x W1^T + b1 -> GELU -> . W2^T + b2) and its backward, written out in
// double on the host with the formulas, for the MLP tests on the host (tests/layer/mlp_test.cpp)
// and on the device (tests/cuda/layer/mlp_test.cu). Inputs and weights are rounded to T first,
// so that the layer under test and the reference start from the same values.
#include <weft/layer/init.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "layer/layer_support.hpp"

namespace weft::test::layer {

inline double gelu_formula(double x) {
  const double s = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
inline double gelu_formula_grad(double x) {
  const double s = std::sqrt(2.0 / 3.14159265358979323846), u = s * (x + 0.044715 * x * x * x),
               t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3 * 0.044715 * x * x);
}

struct mlp_case {
  dmat x, dy, w1, b1, w2, b2; // inputs and parameters (w1, w2: the layers' init scaled by 40)
  dmat w1_init;               // fc1's weight as the layer initialises it (init_normal, std 0.02)
  dmat y, dx, dw1, db1, dw2, db2;
};

/// A tokens x hidden MLP with ffn columns, the weights those of the layers' deterministic init
/// (seed, tensor ids id and id + 1) scaled by 40 so that GELU sees its curved part.
template <class T>
mlp_case mlp_reference(std::size_t tokens, std::size_t hidden, std::size_t ffn, std::uint64_t seed,
                       std::uint64_t id) {
  mlp_case m;
  m.x = random_dmat(tokens, hidden, 1);
  m.dy = random_dmat(tokens, hidden, 2);
  m.b1 = random_dmat(1, ffn, 3);
  m.b2 = random_dmat(1, hidden, 4);
  m.w1 = dmat(ffn, hidden);
  m.w2 = dmat(hidden, ffn);
  weft::layer::init_normal(m.w1.view(), hidden, 0, 0, seed, id, 0.02);
  weft::layer::init_normal(m.w2.view(), ffn, 0, 0, seed, id + 1, 0.02);
  m.w1_init = m.w1;
  for (auto& v : m.w1.flat())
    v *= 40;
  for (auto& v : m.w2.flat())
    v *= 40;
  for (dmat* d : {&m.x, &m.dy, &m.b1, &m.b2, &m.w1, &m.w2})
    round_to<T>(*d);
  const dmat h = ref_linear(m.x, m.w1, &m.b1);
  dmat a(tokens, ffn);
  for (std::size_t i = 0; i < a.size(); ++i)
    a.flat()[i] = gelu_formula(h.flat()[i]);
  m.y = ref_linear(a, m.w2, &m.b2);
  const dmat da = ref_linear_dx(m.dy, m.w2);
  dmat dh(tokens, ffn);
  for (std::size_t i = 0; i < dh.size(); ++i)
    dh.flat()[i] = da.flat()[i] * gelu_formula_grad(h.flat()[i]);
  m.dx = ref_linear_dx(dh, m.w1);
  m.dw1 = ref_linear_dw(dh, m.x);
  m.dw2 = ref_linear_dw(m.dy, a);
  m.db1 = ref_colsum(dh, 0, tokens);
  m.db2 = ref_colsum(m.dy, 0, tokens);
  return m;
}

} // namespace weft::test::layer
