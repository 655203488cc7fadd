// The two-block GPT with its TP group made of MPI processes: each process also trains the same
// model at TP = 1 on its own (one in-process rank) and checks that its shards of the logits and of
// every parameter gradient, and the loss of each of three SGD steps, equal that model's, with and
// without sequence parallelism. ctest runs it with 2 and 4 processes (gpt_test.cpp does TP = 2, 3,
// 4 on threads).
#include <weft/comm/transport/local.hpp>
#include <weft/comm/transport/mpi.hpp>
#include <weft/layer/gpt.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"

namespace {

using weft::layer::no_sequence_parallel;
using weft::layer::sequence_parallel;

constexpr weft::layer::gpt_shape shape{
    .vocab = 37, .hidden = 24, .heads = 12, .ffn = 40, .seq = 6, .layers = 2};
constexpr std::size_t tokens = 2 * shape.seq;
constexpr int steps = 3;

std::vector<std::int32_t> ids_from(std::uint32_t s) {
  std::vector<std::int32_t> v(tokens);
  for (auto& t : v) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((s >> 8) % shape.vocab);
  }
  return v;
}

struct snapshot {
  std::vector<double> losses;
  weft::matrix<double> logits; // first step, full (TP = 1) or this rank's columns
  std::map<std::string, weft::matrix<double>> grads; // first step, this rank's shard
};

template <class Model>
snapshot train(Model& model) {
  const auto ids = ids_from(1);
  const auto targets = ids_from(2);
  snapshot out;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    out.losses.push_back(model.forward(ids, targets));
    model.backward();
    if (step == 0) {
      const auto l = model.logits();
      out.logits.resize(l.rows(), l.cols());
      for (std::size_t r = 0; r < l.rows(); ++r)
        for (std::size_t c = 0; c < l.cols(); ++c)
          out.logits(r, c) = l(r, c);
      for (auto& p : model.parameters()) {
        weft::matrix<double> g(p.grad.rows(), p.grad.cols());
        for (std::size_t r = 0; r < g.rows(); ++r)
          for (std::size_t c = 0; c < g.cols(); ++c)
            g(r, c) = p.grad(r, c);
        out.grads.emplace(p.name, std::move(g));
      }
    }
    for (auto& p : model.parameters())
      for (std::size_t r = 0; r < p.value.rows(); ++r)
        for (std::size_t c = 0; c < p.value.cols(); ++c)
          p.value(r, c) -= 0.5 * p.grad(r, c);
  }
  return out;
}

double rel(double got, double want) {
  return std::abs(got - want) / std::max(1e-300, std::abs(want));
}

template <class SP>
void matches_tp1() {
  snapshot one;
  weft::local::run(1, [&](weft::local::communicator& c) {
    weft::layer::gpt<double, weft::local::communicator> model(c, shape, 99);
    one = train(model);
  });
  auto& world = weft::test::mpi_world();
  weft::layer::gpt<double, weft::mpi::communicator, weft::layer::cblas, SP> model(world, shape, 99);
  const snapshot mine = train(model);
  const std::string where =
      "rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size());
  for (int s = 0; s < steps; ++s)
    EXPECT_LT(rel(mine.losses[s], one.losses[s]), 1e-12) << where << " step " << s;
  const auto vr = weft::layer::split_range(shape.vocab, world.size(), world.rank());
  double worst = 0.0, scale = 0.0;
  for (std::size_t r = 0; r < tokens; ++r)
    for (std::size_t c = 0; c < vr.size(); ++c) {
      worst = std::max(worst, std::abs(mine.logits(r, c) - one.logits(r, vr.begin + c)));
      scale = std::max(scale, std::abs(one.logits(r, vr.begin + c)));
    }
  EXPECT_LT(worst, 1e-12 * scale) << where << " logits";
  for (auto& p : model.parameters()) {
    const auto& full = one.grads.at(p.name);
    const auto& g = mine.grads.at(p.name);
    double d = 0.0, s = 0.0;
    for (std::size_t r = 0; r < g.rows(); ++r)
      for (std::size_t c = 0; c < g.cols(); ++c) {
        d = std::max(d, std::abs(g(r, c) - full(p.row0 + r, p.col0 + c)));
        s = std::max(s, std::abs(full(p.row0 + r, p.col0 + c)));
      }
    EXPECT_LE(d, 1e-12 * s) << where << " " << p.name;
  }
}

TEST(GptMpi, MatchesTp1) { matches_tp1<no_sequence_parallel>(); }
TEST(GptMpi, SequenceParallelMatchesTp1) { matches_tp1<sequence_parallel>(); }

} // namespace
