// What the planner prints for weft::strategy is C++ that compiles and runs: for fixed layouts,
// sim::strategy_type and sim::strategy_config_of give exactly the spellings written here (each
// spelling is the type or initializer the test compiles, stringized), and the two smallest run:
// trained on threads, their losses are the single rank's.
#include <weft/comm/transport/local.hpp>
#include <weft/layer/llama.hpp>
#include <weft/sim/planner.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strategy/strategy_support.hpp"

namespace {

namespace sim = weft::sim;
namespace pl = weft::pipeline;
namespace ts = weft::test::strategy;

// The printed type of `l` is the type named in the macro's arguments, which compiles.
#define EXPECT_TYPE_SPELLED(m, mc, l, ...)                                                         \
  do {                                                                                             \
    using S = __VA_ARGS__;                                                                         \
    static_assert(S::size > 0);                                                                    \
    EXPECT_EQ(S::size, (l).gpus());                                                                \
    EXPECT_EQ(sim::strategy_type(m, mc, l), #__VA_ARGS__);                                         \
  } while (0)

sim::layout layout_of(int tp, int pp, int dp, pl::schedule_kind kind, int chunks, int mb,
                      int batch) {
  sim::layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.schedule = kind;
  l.chunks = chunks;
  l.micro_batch = mb;
  l.global_batch = batch;
  return l;
}

// strategy_support's GPT: 4 layers, hidden 16, 4 heads, FFN 24, sequences of 8, vocabulary 53.
sim::model_spec small_gpt() {
  sim::model_spec m = sim::gpt_shaped("gpt", 4, 16, 4, 53, 8);
  m.ffn = 24;
  return m;
}

TEST(planned_strategy, the_printed_types_of_large_layouts_compile) {
  const sim::model_spec mt_nlg = sim::model_named("mt-nlg-530b");
  const sim::machine a100 = sim::dgx(sim::a100_80gb, 280);
  sim::layout l = layout_of(8, 7, 40, pl::schedule_kind::one_f_one_b, 1, 1, 1920);
  l.zero = 1;
  l.overlap_param_gather = true; // as optim::zero<1> gathers
  l.recomputation = sim::recompute::selective;
  l.sequence_parallel = true;
  // The spellings are compared as written:
  // clang-format off
  EXPECT_TYPE_SPELLED(mt_nlg, a100, l,
                      weft::strategy<weft::mesh<weft::tp<8>, weft::dp<40>, weft::pp<7>>,
                                     weft::pipeline::one_f_one_b, weft::optim::zero<1>,
                                     weft::layer::recompute::selective,
                                     weft::layer::sequence_parallel>);
  // clang-format on

  const sim::model_spec g1t = sim::model_named("gpt-1t");
  const sim::machine a100_384 = sim::dgx(sim::a100_80gb, 384);
  l = layout_of(8, 64, 6, pl::schedule_kind::interleaved, 2, 1, 3072);
  l.recomputation = sim::recompute::full;
  // The spellings are compared as written:
  // clang-format off
  EXPECT_TYPE_SPELLED(g1t, a100_384, l,
                      weft::strategy<weft::mesh<weft::tp<8>, weft::dp<6>, weft::pp<64>>,
                                     weft::pipeline::interleaved<2>, weft::optim::zero<0>,
                                     weft::layer::recompute::full,
                                     weft::layer::no_sequence_parallel>);
  // clang-format on

  const sim::model_spec llama70 = sim::model_named("llama2-70b");
  const sim::machine h100 = sim::dgx(sim::h100_sxm, 64);
  l = layout_of(4, 1, 128, pl::schedule_kind::gpipe, 1, 2, 1024);
  l.zero = 3;
  l.sync = sim::shard_sync::last; // optim::zero<3>'s default (config.gradient_sync last)
  l.sequence_parallel = true;
  // The spellings are compared as written:
  // clang-format off
  EXPECT_TYPE_SPELLED(llama70, h100, l,
                      weft::strategy<weft::mesh<weft::tp<4>, weft::dp<128>, weft::pp<1>>,
                                     weft::pipeline::gpipe, weft::optim::zero<3>,
                                     weft::layer::recompute::none, weft::layer::sequence_parallel,
                                     weft::layer::llama_model>);
  // clang-format on
}

// The printed configuration of `l` is the initializer in the macro's arguments, which compiles
// as S's configuration.
#define CONFIG_SPELLED(S, m, l, ...)                                                               \
  [&] {                                                                                            \
    typename S::config c = __VA_ARGS__;                                                            \
    EXPECT_EQ(sim::strategy_config_of(m, l), #__VA_ARGS__);                                        \
    return c;                                                                                      \
  }()

// Each rank's losses of S over `n` steps of strategy_support's batches.
template <class S>
std::vector<std::vector<double>> losses_of(const typename S::config& c, int n) {
  std::vector<std::vector<double>> per_rank(S::size);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto trainer = S::make(world, c, ts::adamw_rule);
    for (int s = 0; s < n; ++s) {
      const auto b = ts::batch_of(s, c.global_batch, ts::shape);
      per_rank[static_cast<std::size_t>(world.rank())].push_back(
          trainer->train_step(b.ids, b.targets));
    }
  });
  return per_rank;
}

// Every rank of S over 3 steps has the losses of the tied GPT c.model trained on one rank on the
// whole batch (strategy_support's reference).
template <class S>
void expect_trains_as_one_rank(const typename S::config& c) {
  constexpr int steps = 3;
  weft::layer::gpt_shape untied = c.model;
  untied.tie_embeddings = false;
  const std::vector<double> want = ts::reference_losses_of<weft::layer::gpt_model>(
      untied, [&](int s) { return ts::batch_of(s, c.global_batch, c.model); }, ts::adamw_rule, true,
      1, steps);
  const auto got = losses_of<S>(c, steps);
  for (std::size_t r = 0; r < got.size(); ++r)
    ts::expect_same_losses(got[r], want, "rank " + std::to_string(r));
}

TEST(planned_strategy, a_small_printed_gpt_layout_trains_as_one_rank_does) {
  const sim::model_spec m = small_gpt();
  const sim::machine mc = sim::dgx(sim::a100_80gb, 1);
  sim::layout l = layout_of(2, 2, 2, pl::schedule_kind::interleaved, 2, 1, 8);
  l.zero = 1;
  l.overlap_param_gather = true; // as optim::zero<1> gathers
  l.recomputation = sim::recompute::selective;
  l.sequence_parallel = true;
  using S = weft::strategy<weft::mesh<weft::tp<2>, weft::dp<2>, weft::pp<2>>,
                           weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                           weft::layer::recompute::selective, weft::layer::sequence_parallel>;
  // The spellings are compared as written:
  // clang-format off
  EXPECT_TYPE_SPELLED(m, mc, l,
                      weft::strategy<weft::mesh<weft::tp<2>, weft::dp<2>, weft::pp<2>>,
                                     weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                                     weft::layer::recompute::selective,
                                     weft::layer::sequence_parallel>);
  // clang-format on
  // The spelling is compared as written:
  // clang-format off
  const auto c = CONFIG_SPELLED(S, m, l,
      {.model = {.vocab = 53, .hidden = 16, .heads = 4, .ffn = 24, .seq = 8, .layers = 4,
                 .tie_embeddings = true}, .micro_batch = 1, .global_batch = 8});
  // clang-format on
  EXPECT_EQ(sim::launch_line(mc, l, "./train"), "mpirun -n 8 --map-by ppr:8:node ./train");
  expect_trains_as_one_rank<S>(c);
}

// ZeRO-2 over several micro-batches runs as the simulator prices it (a reduce-scatter every
// micro-batch): the printed configuration says gradient_sync every, compiles, and trains as one
// rank does.
TEST(planned_strategy, a_printed_zero_2_layout_reduces_every_micro_batch_and_trains_as_one_rank) {
  const sim::model_spec m = small_gpt();
  const sim::machine mc = sim::dgx(sim::a100_80gb, 1);
  sim::layout l = layout_of(1, 2, 2, pl::schedule_kind::one_f_one_b, 1, 1, 8);
  l.zero = 2;
  ASSERT_EQ(l.microbatches(), 4);
  ASSERT_EQ(sim::strategy_refusal(m, mc, l), "");
  using S = weft::strategy<weft::mesh<weft::tp<1>, weft::dp<2>, weft::pp<2>>,
                           weft::pipeline::one_f_one_b, weft::optim::zero<2>,
                           weft::layer::recompute::none, weft::layer::no_sequence_parallel>;
  // The spelling is compared as written:
  // clang-format off
  const auto c = CONFIG_SPELLED(S, m, l,
      {.model = {.vocab = 53, .hidden = 16, .heads = 4, .ffn = 24, .seq = 8, .layers = 4,
                 .tie_embeddings = true}, .micro_batch = 1, .global_batch = 8,
       .gradient_sync = weft::optim::gradient_sync::every});
  // clang-format on
  expect_trains_as_one_rank<S>(c);
}

// The reasons strategy_refusal gives for layouts whose type compiles are the strategy's own: each
// such layout, made, throws on every rank with the strategy's phrase for what strategy_refusal
// names.
template <class S>
std::vector<std::string> errors_of(weft::strategy_config c) {
  std::vector<std::string> what(S::size);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    try {
      (void)S::make(world, c, ts::adamw_rule);
    } catch (const weft::error& e) {
      what[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  return what;
}

template <int TP, int DP, int PP>
using small_strategy =
    weft::strategy<weft::mesh<weft::tp<TP>, weft::dp<DP>, weft::pp<PP>>,
                   weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                   weft::layer::recompute::selective, weft::layer::sequence_parallel>;

void expect_both_refuse(const sim::model_spec& m, const sim::machine& mc, const sim::layout& l,
                        const std::vector<std::string>& errors, const std::string& planner_says,
                        const std::string& strategy_says) {
  const std::string why = sim::strategy_refusal(m, mc, l);
  EXPECT_NE(why.find(planner_says), std::string::npos) << why;
  ASSERT_FALSE(errors.empty());
  for (std::size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find(strategy_says), std::string::npos)
        << "rank " << r << ": " << errors[r];
}

TEST(planned_strategy, what_the_planner_refuses_the_strategy_refuses) {
  const sim::machine one_node = sim::dgx(sim::a100_80gb, 1);
  weft::strategy_config c{.model = ts::shape, .micro_batch = 1, .global_batch = 8};
  const sim::model_spec m = small_gpt();
  sim::layout l = layout_of(2, 3, 1, pl::schedule_kind::interleaved, 2, 1, 8);
  l.sequence_parallel = true;
  // 4 layers over 3 stages x 2 chunks
  expect_both_refuse(m, one_node, l, errors_of<small_strategy<2, 1, 3>>(c), "do not split evenly",
                     "do not split evenly");
  // 6 tokens of a micro-batch over TP 4
  sim::model_spec short_seq = m;
  short_seq.seq = 6;
  l = layout_of(4, 2, 1, pl::schedule_kind::interleaved, 2, 1, 8);
  l.sequence_parallel = true;
  weft::strategy_config c6 = c;
  c6.model.seq = 6;
  expect_both_refuse(short_seq, one_node, l, errors_of<small_strategy<4, 1, 2>>(c6),
                     "does not split over tp 4", "does not split over 4 tensor-parallel ranks");
  // TP 2 on nodes of one GPU
  const sim::machine single_gpu_nodes{sim::a100_80gb, weft::topology::parse("4x1")};
  l = layout_of(2, 2, 1, pl::schedule_kind::interleaved, 2, 1, 8);
  l.sequence_parallel = true;
  weft::strategy_config spread = c;
  spread.cluster = weft::topology::parse("4x1");
  expect_both_refuse(m, single_gpu_nodes, l, errors_of<small_strategy<2, 1, 2>>(spread),
                     "spans nodes", "tensor-parallel (tp) group of ranks [0, 1] on nodes [0, 1]");
  // and the same layout on one node runs
  EXPECT_EQ(sim::strategy_refusal(m, one_node, l), "");
  c.cluster = weft::topology::parse("1x4");
  for (const std::string& e : errors_of<small_strategy<2, 1, 2>>(c))
    EXPECT_EQ(e, "");
}

TEST(planned_strategy, the_printed_llama_configuration_compiles) {
  const sim::model_spec llama70 = sim::model_named("llama2-70b");
  sim::layout l = layout_of(4, 1, 128, pl::schedule_kind::gpipe, 1, 2, 1024);
  using S =
      weft::strategy<weft::mesh<weft::tp<4>, weft::dp<128>, weft::pp<1>>, weft::pipeline::gpipe,
                     weft::optim::zero<3>, weft::layer::recompute::none,
                     weft::layer::sequence_parallel, weft::layer::llama_model>;
  // The spelling is compared as written:
  // clang-format off
  const auto c = CONFIG_SPELLED(S, llama70, l,
      {.model = {.vocab = 32000, .hidden = 8192, .heads = 64, .kv_heads = 8, .ffn = 28672,
                 .seq = 4096, .layers = 80}, .micro_batch = 2, .global_batch = 1024});
  // clang-format on
  EXPECT_EQ(c.model.ffn_size(), 28672u);
}

} // namespace
