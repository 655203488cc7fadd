// A layout's sharding (sim/layout.hpp, with sharded.hpp's engine presets): the engines by name,
// the ZeRO stage each runs, the groups each model state is divided over, the optimizer states
// by name, and the checks that refuse what does not agree.
#include <weft/sim/layout.hpp>
#include <weft/sim/sharded.hpp>
#include <weft/sim/step.hpp>

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace weft::sim;

TEST(sim_layout, shard_engines_by_name_and_stage) {
  const struct {
    const char* name;
    shard_engine engine;
    int stage;
  } engines[] = {{"deepspeed-zero3", shard_engine::deepspeed_zero3, 3},
                 {"fsdp", shard_engine::fsdp, 3},
                 {"fsdp2", shard_engine::fsdp2, 3},
                 {"megatron-distopt", shard_engine::megatron_distopt, 1}};
  for (const auto& e : engines) {
    EXPECT_EQ(shard_engine_named(e.name), e.engine) << e.name;
    EXPECT_EQ(name_of(e.engine), e.name);
    layout l;
    l.dp = 4;
    use_shard_engine(l, e.engine);
    EXPECT_EQ(l.sharding, e.engine) << e.name;
    EXPECT_EQ(l.zero, e.stage) << e.name;
  }
  try {
    (void)shard_engine_named("hsdp");
    ADD_FAILURE() << "hsdp is fsdp with a shard group, not an engine of its own";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown sharding engine 'hsdp': expected "
                                         "deepspeed-zero3, fsdp, fsdp2 or megatron-distopt"),
              std::string::npos)
        << e.what();
  }
}

// The groups each state is divided over: ZeRO's stages over the DP group, HSDP's over its
// shard group.
TEST(sim_layout, shard_groups_follow_the_stage_and_the_shard_group) {
  layout l;
  l.dp = 16;
  const auto groups = [&] {
    const state_shards s = l.shard_groups();
    return std::to_string(s.weights) + " " + std::to_string(s.gradients) + " " +
           std::to_string(s.optimizer);
  };
  EXPECT_EQ(groups(), "1 1 1");
  l.zero = 1;
  EXPECT_EQ(groups(), "1 1 16");
  l.zero = 2;
  EXPECT_EQ(groups(), "1 16 16");
  l.zero = 3;
  EXPECT_EQ(groups(), "16 16 16");
  l.shard_group = 4;
  EXPECT_EQ(groups(), "4 4 4");
}

TEST(sim_layout, optimizer_states_by_name) {
  EXPECT_DOUBLE_EQ(optimizer_state_named("fp32"), 12);       // fp32 master, momentum, variance
  EXPECT_DOUBLE_EQ(optimizer_state_named("remainders"), 10); // 16-bit remainders, fp32 moments
  EXPECT_DOUBLE_EQ(optimizer_state_named("bf16"), 4);        // bf16 moments, no master
  EXPECT_THROW((void)optimizer_state_named("fp16"), weft::error);
}

// A step refuses an engine that does not run the layout's ZeRO stage, a negative byte count,
// and ZeRO-3's copies on another stage.
TEST(sim_layout, the_engine_and_the_stage_must_agree) {
  model_spec m;
  m.name = "small";
  m.layers = 4;
  m.hidden = 256;
  m.heads = 4;
  m.seq = 128;
  m.vocab = 1000;
  const machine mc = dgx(a100_80gb, 1);
  const auto refusal = [&](const layout& l) {
    try {
      (void)simulate_step(m, mc, l);
    } catch (const weft::error& e) {
      return std::string(e.what());
    }
    return std::string("(none)");
  };
  layout l;
  l.dp = 8;
  use_shard_engine(l, shard_engine::fsdp);
  EXPECT_EQ(refusal(l), "(none)");
  l.zero = 1;
  EXPECT_NE(refusal(l).find("sharding fsdp runs ZeRO-3, not zero 1"), std::string::npos)
      << refusal(l);
  use_shard_engine(l, shard_engine::megatron_distopt);
  EXPECT_EQ(refusal(l), "(none)");
  l.zero = 2;
  EXPECT_NE(refusal(l).find("sharding megatron-distopt runs ZeRO-1, not zero 2"), std::string::npos)
      << refusal(l);
  l.zero = 1;
  l.optimizer_bytes = -1;
  EXPECT_NE(refusal(l).find("optimizer_bytes must be at least 0, not -1"), std::string::npos)
      << refusal(l);
  l.optimizer_bytes = 12;
  l.grad_accumulation_bytes = -6;
  EXPECT_NE(refusal(l).find("grad_accumulation_bytes must be at least 0, not -6"),
            std::string::npos)
      << refusal(l);
  l.grad_accumulation_bytes = 0;
  l.optimizer_traffic_bytes = -88;
  EXPECT_NE(refusal(l).find("optimizer_traffic_bytes must be at least 0, not -88"),
            std::string::npos)
      << refusal(l);
  l.optimizer_traffic_bytes = 0;
  l.shard_copy_bytes = 4; // ZeRO-3's copies, on ZeRO-1
  EXPECT_NE(refusal(l).find("shard_copy_bytes are ZeRO-3's copies: they need zero 3, not 1"),
            std::string::npos)
      << refusal(l);
  use_shard_engine(l, shard_engine::fsdp);
  EXPECT_EQ(refusal(l), "(none)");
  l.shard_copy_bytes = -4;
  EXPECT_NE(refusal(l).find("shard_copy_bytes must be at least 0, not -4"), std::string::npos)
      << refusal(l);
}

} // namespace
