// The memory account (sim/memory.hpp) against bytes worked out by hand: each model state divided
// by exactly the GPUs it is sharded over (ZeRO stages over the DP group, HSDP over its shard
// group), and Nemotron-4 340B's DGX Cloud recipe term by term.
#include <weft/sim/memory.hpp>
#include <weft/sim/planner.hpp>
#include <weft/sim/sharded.hpp>
#include <weft/sim/step.hpp>

#include <gtest/gtest.h>

#include <cstdio>

#include "sim/nemotron_recipe.hpp"

namespace {

using namespace weft::sim;
using weft_test::nemotron_recipe;
namespace pl = weft::pipeline;

constexpr double gib = 1024.0 * 1024 * 1024;

// Llama-2-7B's shape: 32 layers, hidden 4096, 32 heads (no grouped-query attention), a SwiGLU
// MLP of 11008, 4096-token sequences, a 32000-word vocabulary.
model_spec llama_7b() { return llama_shaped("llama-7b", 32, 4096, 32, 0, 11008); }

// Its weights as the simulator counts a layer (model_spec::layer_parameters: Q, K, V and the
// output projection 4 h^2, three MLP matrices 3 h f, and GPT's biases and norms 9 h + f), plus
// the embedding and the output layer, 2 V h:
//   32 (4 x 4096^2 + 3 x 4096 x 11008 + 9 x 4096 + 11008) + 2 x 32000 x 4096
//   = 32 x 202,423,040 + 262,144,000 = 6,739,681,280
constexpr double llama_7b_weights = 6739681280.0;

// 128 H100 (16 DGX H100), one sequence per GPU and step, FSDP's ZeRO-3.
layout on_128(int shard_group) {
  layout l;
  l.dp = 128;
  l.global_batch = 128;
  use_shard_engine(l, shard_engine::fsdp);
  l.shard_group = shard_group;
  return l;
}

TEST(sim_memory, fsdp_shards_every_state_over_the_dp_group_and_hsdp_over_its_shard_group) {
  const model_spec m = llama_7b();
  EXPECT_DOUBLE_EQ(m.parameters(), llama_7b_weights);
  const machine mc = dgx(h100_sxm, 16);
  // bf16 weights (2 bytes), bf16 gradients (2), fp32 Adam state (12: master weights, momentum,
  // variance); FSDP over all 128 GPUs divides each by 128:
  //   weights 2 x 6,739,681,280 / 128 = 105,307,520; gradients the same;
  //   optimizer 12 x 6,739,681,280 / 128 = 631,845,120; in all 842,460,160 (0.78 GiB).
  const state_memory fsdp = simulate_step(m, mc, on_128(0)).states;
  EXPECT_DOUBLE_EQ(fsdp.weights, 105307520.0);
  EXPECT_DOUBLE_EQ(fsdp.gradients, 105307520.0);
  EXPECT_DOUBLE_EQ(fsdp.optimizer, 631845120.0);
  // HSDP 8 x 16: the same states sharded over each node's 8 GPUs, replicated across the 16 nodes:
  //   weights 2 x 6,739,681,280 / 8 = 1,684,920,320; gradients the same;
  //   optimizer 12 x 6,739,681,280 / 8 = 10,109,521,920; in all 13,479,362,560 (12.6 GiB),
  // sixteen times FSDP's, not FSDP's as when every state was divided by the DP group.
  const state_memory hsdp = simulate_step(m, mc, on_128(8)).states;
  EXPECT_DOUBLE_EQ(hsdp.weights, 1684920320.0);
  EXPECT_DOUBLE_EQ(hsdp.gradients, 1684920320.0);
  EXPECT_DOUBLE_EQ(hsdp.optimizer, 10109521920.0);
  EXPECT_DOUBLE_EQ(hsdp.total(), 13479362560.0);
  std::printf("  Llama 7B on 128 H100: FSDP %.2f GiB of states per GPU, HSDP 8 x 16 %.2f GiB\n",
              fsdp.total() / gib, hsdp.total() / gib);
}

// ZeRO-3's buffers beside the shards, in 16 bits: two layers' gathered weights (the one in use
// and the next) by default; all of the rank's weights where the forward's gathers stay for the
// backward (SHARD_GRAD_OP, reshard_after_forward false) or for the step (gathered once a step),
// and all its gradients besides where they accumulate whole across micro-batches (no_sync, or
// once a step), in 16 bits, or FSDP2's reduce dtype. Llama 7B on 128 H100s, two micro-batches a
// step:
//   one layer 202,423,040 weights, so two layers' buffers 4 x 202,423,040 = 809,692,160 bytes;
//   the whole model 6,739,681,280 weights, 2 bytes each = 13,479,362,560 bytes.
TEST(sim_memory, zero3_buffers_follow_what_the_layout_keeps_whole) {
  const model_spec m = llama_7b();
  const machine mc = dgx(h100_sxm, 16);
  layout l = on_128(0);
  l.global_batch = 256;
  ASSERT_EQ(l.microbatches(), 2);
  const auto buffers = [&](const layout& x) {
    const step_result r = simulate_step(m, mc, x);
    EXPECT_DOUBLE_EQ(estimate_memory(m, x), r.memory_bytes()) << describe(x);
    return r.buffer_bytes;
  };
  const double layers_two = 809692160.0, whole = 13479362560.0;
  EXPECT_DOUBLE_EQ(buffers(l), layers_two);
  layout shard_grad_op = l;
  shard_grad_op.reshard_after_forward = false;
  EXPECT_DOUBLE_EQ(buffers(shard_grad_op), whole);
  layout no_sync = l;
  no_sync.sync = shard_sync::last;
  EXPECT_DOUBLE_EQ(buffers(no_sync), layers_two + whole);
  layout once = l;
  once.sync = shard_sync::once;
  EXPECT_DOUBLE_EQ(buffers(once), whole + whole);
  // FSDP2 accumulates the whole gradients in its reduce dtype: fp32, 4 x 6,739,681,280.
  layout fsdp2 = l;
  use_shard_engine(fsdp2, shard_engine::fsdp2);
  fsdp2.sync = shard_sync::last;
  fsdp2.grad_bytes = 4;
  EXPECT_DOUBLE_EQ(buffers(fsdp2), layers_two + 26958725120.0);
  // With one micro-batch a step no gradient waits for a later one: the only backward
  // reduce-scatters each block's, as without no_sync; the weights stay whole once a step.
  layout single = no_sync;
  single.global_batch = 128;
  ASSERT_EQ(single.microbatches(), 1);
  EXPECT_DOUBLE_EQ(buffers(single), layers_two);
  single.sync = shard_sync::once;
  EXPECT_DOUBLE_EQ(buffers(single), whole);
  // Below ZeRO-3 nothing is gathered.
  layout zero2 = l;
  use_shard_engine(zero2, shard_engine::none);
  zero2.zero = 2;
  EXPECT_DOUBLE_EQ(buffers(zero2), 0);
}

// Each ZeRO stage divides its own states by the DP group and leaves the others whole: stage 1 the
// optimizer state, 2 the gradients too, 3 the weights too.
TEST(sim_memory, each_zero_stage_divides_only_its_states) {
  const model_spec m = llama_7b();
  const machine mc = dgx(h100_sxm, 16);
  const double P = llama_7b_weights;
  const double divisor[4][3] = {
      {1, 1, 1}, {1, 1, 128}, {1, 128, 128}, {128, 128, 128}}; // weights, gradients, optimizer
  for (int stage = 0; stage <= 3; ++stage) {
    layout l;
    l.dp = 128;
    l.global_batch = 128;
    l.zero = stage;
    l.recomputation = recompute::full;
    const state_memory s = simulate_step(m, mc, l).states;
    EXPECT_DOUBLE_EQ(s.weights, 2 * P / divisor[stage][0]) << "ZeRO-" << stage;
    EXPECT_DOUBLE_EQ(s.gradients, 2 * P / divisor[stage][1]) << "ZeRO-" << stage;
    EXPECT_DOUBLE_EQ(s.optimizer, 12 * P / divisor[stage][2]) << "ZeRO-" << stage;
  }
}

// What the planner checks before it simulates (estimate_memory) for Llama 2 70B under full
// recompute on 128 H100: FSDP over 128 fits in the 80 GB the simulator lets a layout use; HSDP
// over nodes of 8 does not, its states alone being 16 bytes x P / 8 = 2 P:
//   P = 80 (h^2 (1 + 2 x 8/64) + h^2 + 3 h f + 9 h + f) + 2 V h, h 8192, f 28672, V 32000
//     = 80 x 855,740,416 + 524,288,000 = 68,983,521,280; 2 P = 137,967,042,560 > 80e9.
// Divided by the DP group, HSDP's states read 8.6 GB and the layout passed for one that fits.
TEST(sim_memory, hsdp_that_does_not_fit_is_not_taken_for_one_that_does) {
  model_spec m = llama_7b();
  m.name = "llama2-70b";
  m.layers = 80;
  m.hidden = 8192;
  m.heads = 64;
  m.kv_heads = 8;
  m.ffn = 28672;
  const double P = 68983521280.0;
  EXPECT_DOUBLE_EQ(m.parameters(), P);
  layout fsdp = on_128(0), hsdp = on_128(8);
  fsdp.recomputation = hsdp.recomputation = recompute::full;
  const double limit = h100_sxm.hbm_bytes;
  EXPECT_LT(estimate_memory(m, fsdp), limit);
  EXPECT_GT(2 * P, limit);
  EXPECT_GE(estimate_memory(m, hsdp), 2 * P);
  EXPECT_GT(estimate_memory(m, hsdp), limit);
}

// Nemotron-4 340B's DGX Cloud recipe (sim::model_named, sim/nemotron_recipe.hpp) on its
// fullest GPU, the first pipeline rank, term by term.

// Weights of the first pipeline rank per TP rank: 12 layers and the word embedding, over TP 8.
//   a layer: h^2 (1 + 2 x 8/96) (QKV, 8 key-value groups for 96 heads) + h^2 + 2 h f (the
//   squared-ReLU MLP's two matrices) + 9 h + f = 396,361,728 + 339,738,624 + 2,717,908,992
//   + 239,616 = 3,454,248,960
//   (12 x 3,454,248,960 + 256,000 x 18,432) / 8 = 5,181,373,440 + 589,824,000 = 5,771,197,440
constexpr double nemotron_first_rank_weights = 5771197440.0;

// Its activations: Korthikanti et al. 2022, Table 2, with sequence parallelism, flash attention
// (no s x s scores) and no dropout (no masks), each layer keeps s b h / t x (8 + 4 + 4 g/a +
// 4 f/h) bytes: the two layer norms' inputs and outputs 8, Q and the attention's output 4, K and
// V 4 x 8/96, the MLP's two f-wide tensors 4 x 73728/18432 = 16; 85/3 in all:
//   4096 x 18432 / 8 x 85/3 = 9,437,184 x 85/3 = 267,386,880 bytes a layer.
// The interleaved schedule's warm-up on the first rank, (p - 1) 2 + (v - 1) p = 14 + 88 = 102
// one-layer chunks, and one more in the steady state: 103 held at once (Megatron-core's
// forward_backward_pipelining_with_interleaving; Megatron-LM's theoretical_memory_usage.py has
// the same: p (1 + (p - 1)/(p v)) micro-batches of a stage's 12 layers = 103 layers).
//   103 x 267,386,880 = 27,540,848,640
// and the token ids of the micro-batches chunk 0 holds (8 bytes each, 103/12 of them):
//   8 x 4096 x 103 / 12 = 281,258.67
constexpr double nemotron_first_rank_activations = 27540848640.0 + 8.0 * 4096 * 103 / 12;

TEST(sim_memory, nemotron_4_340b_recipe_term_by_term) {
  const model_spec m = model_named("nemotron4-340b");
  const layout l = nemotron_recipe();
  const double P = nemotron_first_rank_weights;
  const step_result r = simulate_step(m, dgx(h100_sxm, 16), l);
  // Megatron-core's distributed optimizer on bf16 weights and gradients reduced in bf16: 2 + 2
  // bytes whole and 12 of fp32 state over DP 2 (its guide: 4 + 12/d bytes a weight at the
  // step's activation peak; the fp32 copy of the gradient shard it adds, 4/d, lives only during
  // the optimizer step, when the activations are gone).
  EXPECT_DOUBLE_EQ(r.states.weights, 2 * P);
  EXPECT_DOUBLE_EQ(r.states.gradients, 2 * P);
  EXPECT_DOUBLE_EQ(r.states.optimizer, 12 * P / 2);
  const auto near = [](double x) { return 1e-12 * x; }; // the sums round in their last bits
  EXPECT_NEAR(r.activation_bytes, nemotron_first_rank_activations,
              near(nemotron_first_rank_activations));
  // 4 P + 6 P + activations = 57,711,974,400 + 27,541,129,898.67 = 85,253,104,298.67 (79.4 GiB)
  const double megatron = 10 * P + nemotron_first_rank_activations;
  EXPECT_NEAR(r.memory_bytes(), megatron, near(megatron));
  EXPECT_NEAR(estimate_memory(m, l), megatron, near(megatron));
  // The recipe's optimizer is NeMo's distributed_fused_adam (Apex's DistributedFusedAdam) with
  // dtype bf16: bf16 momentum and variance, no master copy of the bf16 weights, 4 bytes over DP 2:
  //   4 P + 2 P + activations = 62,168,314,538.67 (57.9 GiB)
  layout bf16 = l;
  bf16.optimizer_bytes = optimizer_state_named("bf16");
  const double bf16_bytes = 6 * P + nemotron_first_rank_activations;
  EXPECT_NEAR(estimate_memory(m, bf16), bf16_bytes, near(bf16_bytes));
  // With an fp32 state it keeps the 16 bits that make a bf16 weight its fp32 master, and fp32
  // moments: 10 bytes over DP 2: 4 P + 5 P + activations = 79,481,906,858.67 (74.0 GiB).
  layout remainders = l;
  remainders.optimizer_bytes = optimizer_state_named("remainders");
  const double remainder_bytes = 9 * P + nemotron_first_rank_activations;
  EXPECT_NEAR(estimate_memory(m, remainders), remainder_bytes, near(remainder_bytes));
  std::printf(
      "  Nemotron-4 340B, DGX Cloud recipe: %.1f GiB per GPU under Megatron-core's "
      "distributed optimizer, %.1f with Apex's and fp32 state, %.1f with bf16 state "
      "(%.1f usable)\n",
      megatron / gib, estimate_memory(m, remainders) / gib, estimate_memory(m, bf16) / gib,
      h100_sxm.hbm_bytes / gib);
}

} // namespace
