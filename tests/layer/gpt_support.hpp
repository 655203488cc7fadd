#pragma once
// The two-block GPT the TP tests train (tests/layer/gpt_test.cpp on the host, tests/cuda/layer/
// gpt_test.cu on the device): its shape, its data, a host training run that collects the losses,
// the first step's logits and every gradient as full matrices, and the norm-wise difference.
#include <weft/layer/cblas.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/init.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "layer/layer_support.hpp"

namespace weft::test::layer::gpt_run {

using comm_t = weft::local::communicator;

constexpr weft::layer::gpt_shape shape{
    .vocab = 37, .hidden = 24, .heads = 12, .ffn = 40, .seq = 6, .layers = 2};
constexpr std::size_t batch = 2;
constexpr std::size_t tokens = batch * shape.seq;
constexpr int steps = 3;
constexpr double learning_rate = 0.5;

struct run_result {
  std::vector<double> losses;        // one per step, before its update
  dmat logits;                       // tokens x vocab, first step
  std::map<std::string, dmat> grads; // full shapes, first step
};

std::vector<std::int32_t> ids_from(std::uint32_t s) {
  std::vector<std::int32_t> v(tokens);
  std::uint32_t x = s;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((x >> 8) % shape.vocab);
  }
  return v;
}

/// Copies a rank's shard into the full matrix (creating it from the TP = 1 shape on first use).
void place(std::map<std::string, dmat>& into, const std::string& name,
           weft::matrix_view<const double> v, std::size_t row0, std::size_t col0,
           std::size_t full_rows, std::size_t full_cols) {
  auto [it, fresh] = into.try_emplace(name, full_rows, full_cols);
  (void)fresh;
  for (std::size_t r = 0; r < v.rows(); ++r)
    for (std::size_t c = 0; c < v.cols(); ++c)
      it->second(row0 + r, col0 + c) = v(r, c);
}

template <class T>
weft::matrix<double> as_double(weft::matrix_view<const T> v) {
  weft::matrix<double> d(v.rows(), v.cols());
  for (std::size_t r = 0; r < v.rows(); ++r)
    for (std::size_t c = 0; c < v.cols(); ++c)
      d(r, c) = static_cast<double>(v(r, c));
  return d;
}

/// The host model at TP = tp trained `steps` SGD steps (Gemm: the host GEMM policy), each over
/// `micro_batches` forwards and backwards whose gradients accumulate (the losses and logits are
/// the first micro-batch's).
template <class T, class SP, class Recompute, class Gemm = weft::layer::cblas>
run_result train(int tp, int micro_batches = 1) {
  run_result out;
  std::mutex mu;
  run_ranks(tp, [&](comm_t& c) {
    weft::layer::gpt<T, comm_t, Gemm, SP, Recompute> model(c, shape, 99);
    for (int step = 0; step < steps; ++step) {
      model.zero_grad();
      double loss = 0.0;
      for (int m = micro_batches; m-- > 0;) { // the first micro-batch last: its logits stay
        const auto ids = ids_from(static_cast<std::uint32_t>(1 + 2 * m));
        const auto targets = ids_from(static_cast<std::uint32_t>(2 + 2 * m));
        loss = model.forward(ids, targets);
        model.backward();
      }
      std::lock_guard lock(mu);
      if (c.rank() == 0) out.losses.push_back(loss);
      if (step == 0) {
        const auto vr = weft::layer::split_range(shape.vocab, tp, c.rank());
        place(out.grads, "logits", as_double(model.logits()).view(), 0, vr.begin, tokens,
              shape.vocab);
        for (auto& p : model.parameters()) {
          const auto g = as_double(
              weft::matrix_view<const T>(p.grad.data(), p.grad.rows(), p.grad.cols(), p.grad.ld()));
          place(out.grads, p.name, g.view(), p.row0, p.col0, p.full_rows, p.full_cols);
        }
      }
      // Plain SGD on every shard.
      for (auto& p : model.parameters())
        for (std::size_t r = 0; r < p.value.rows(); ++r)
          for (std::size_t col = 0; col < p.value.cols(); ++col)
            p.value(r, col) -= static_cast<T>(learning_rate) * p.grad(r, col);
    }
  });
  out.logits = std::move(out.grads.at("logits"));
  out.grads.erase("logits");
  return out;
}

/// max |got - want| / max |want|, over two full matrices of the same shape.
double difference(const dmat& got, const dmat& want) {
  EXPECT_EQ(got.rows(), want.rows());
  EXPECT_EQ(got.cols(), want.cols());
  double d = 0.0, scale = 0.0;
  for (std::size_t r = 0; r < std::min(got.rows(), want.rows()); ++r)
    for (std::size_t c = 0; c < std::min(got.cols(), want.cols()); ++c) {
      d = std::max(d, std::isfinite(got(r, c)) ? std::abs(got(r, c) - want(r, c)) : 1e300);
      scale = std::max(scale, std::abs(want(r, c)));
    }
  return scale == 0.0 ? d : d / scale;
}

/// got's losses, logits and every gradient against want's, each within tol (relative, norm-wise).
inline void expect_same_training(const run_result& got, const run_result& want, double tol) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], tol * std::abs(want.losses[s])) << "step " << s;
  }
  EXPECT_LT(difference(got.logits, want.logits), tol) << "logits";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    EXPECT_LT(difference(got.grads.at(name), g), tol) << name;
  }
}

} // namespace weft::test::layer::gpt_run
