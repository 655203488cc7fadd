// The two-block GPT at TP = 2, 3, 4 against the same model at TP = 1: the loss, the logits and
// every parameter's gradient after one forward and backward, and the losses of three SGD steps,
// with and without sequence parallelism and under each recompute policy, in float and in double.
// The vocabulary (37) divides by none of the TP sizes, and the FFN width (40) not by 3.
//
// The TP = 1 model itself is checked against independent references elsewhere (the layers'
// tests, the block's finite differences); here each rank's shards are put back into full
// matrices at their place (parameter::row0/col0) and compared with TP = 1's. Also with every
// element-wise step run backwards (reversed_elements.hpp), as a device may run them.
#include <gtest/gtest.h>

#include <string>

#include "layer/gpt_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

using namespace weft::test::layer;
using namespace weft::test::layer::gpt_run;
using weft::layer::no_sequence_parallel;
using weft::layer::sequence_parallel;
namespace recompute = weft::layer::recompute;

template <class T, class SP, class Recompute, class Gemm = weft::layer::cblas>
void matches_tp1() {
  const run_result one = train<T, no_sequence_parallel, recompute::none>(1);
  ASSERT_EQ(one.losses.size(), static_cast<std::size_t>(steps));
  // The model learns something in three steps: the losses fall.
  EXPECT_LT(one.losses.back(), one.losses.front());
  for (int tp : {1, 2, 3, 4}) {
    const run_result r = train<T, SP, Recompute, Gemm>(tp);
    SCOPED_TRACE("tp=" + std::to_string(tp));
    expect_same_training(r, one, tolerance<T>);
  }
}

template <class Recompute>
void every_type_and_sequence_policy() {
  matches_tp1<float, no_sequence_parallel, Recompute>();
  matches_tp1<double, no_sequence_parallel, Recompute>();
  matches_tp1<float, sequence_parallel, Recompute>();
  matches_tp1<double, sequence_parallel, Recompute>();
}

TEST(Gpt, MatchesTp1) { every_type_and_sequence_policy<recompute::none>(); }
TEST(Gpt, SelectiveRecomputeMatchesTp1) { every_type_and_sequence_policy<recompute::selective>(); }
TEST(Gpt, FullRecomputeMatchesTp1) { every_type_and_sequence_policy<recompute::full>(); }

// Every element-wise step of the model run backwards, as a device may run them (exec.hpp).
TEST(Gpt, ElementOrderDoesNotMatter) {
  matches_tp1<double, no_sequence_parallel, recompute::selective, reversed_elements>();
  matches_tp1<double, sequence_parallel, recompute::full, reversed_elements>();
}

// Gradients accumulated over three backwards between zero_grad()s, as a trainer with several
// micro-batches per step does. Under sequence parallelism each backward reduces the replicated
// parameters' partial sums over the TP group: it once reduced what earlier backwards had
// accumulated too, counting them tp times (the LayerNorms and row-parallel biases).
TEST(Gpt, AccumulatedBackwardsMatchTp1) {
  const run_result one = train<double, no_sequence_parallel, recompute::none>(1, 3);
  for (int tp : {2, 3}) {
    SCOPED_TRACE("tp=" + std::to_string(tp));
    expect_same_training(train<double, sequence_parallel, recompute::none>(tp, 3), one,
                         tolerance<double>);
    expect_same_training(train<double, no_sequence_parallel, recompute::selective>(tp, 3), one,
                         tolerance<double>);
  }
  const run_result one_float = train<float, no_sequence_parallel, recompute::none>(1, 2);
  expect_same_training(train<float, sequence_parallel, recompute::full>(2, 2), one_float,
                       tolerance<float>);
}

TEST(Gpt, BadBatchIsAnError) {
  run_ranks(2, [](comm_t& c) {
    weft::layer::gpt<float, comm_t, weft::layer::cblas, sequence_parallel> model(c, shape, 1);
    std::vector<std::int32_t> ids(shape.seq + 1, 0);
    expect_error([&] { (void)model.forward(ids, ids); }, "whole number of sequences");
  });
}

} // namespace
