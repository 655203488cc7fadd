// The model spec's arithmetic against the published formulas and figures: SC21 Eq. 2 and 3
// written out here, the parameter counts of SC21 Table 1, the ZeRO paper's memory example,
// Korthikanti et al.'s Table 2, and the 1F1B bubble of the mission brief.
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/stats.hpp>
#include <weft/sim/model.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

namespace {

using weft::sim::gpt_shaped;
using weft::sim::llama_shaped;
using weft::sim::model_named;
using weft::sim::model_spec;
using weft::sim::recompute;

TEST(sim_model, parameters_follow_sc21_eq2_and_table1) {
  // SC21 Table 1: (layers, hidden, heads, published billions).
  struct row {
    int l, h, a;
    double billions;
  };
  for (const row r : {row{24, 2304, 24, 1.7}, row{40, 6144, 48, 18.4}, row{80, 12288, 96, 145.6},
                      row{96, 16384, 128, 310.1}, row{128, 25600, 160, 1008.0}}) {
    const model_spec m = gpt_shaped("gpt", r.l, r.h, r.a);
    const double l = r.l, h = r.h, V = 51200, s = 2048;
    const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    EXPECT_NEAR(m.parameters(), eq2, eq2 * 1e-12) << r.billions;
    EXPECT_NEAR(weft::sim::sc21_parameters(l, h, V, s), eq2, eq2 * 1e-12);
    // The published figure, rounded to its digits.
    EXPECT_NEAR(m.parameters() / 1e9, r.billions, 0.06 + r.billions * 0.002) << r.billions;
  }
}

// Untied embeddings and grouped-query attention against the exact sizes Meta publishes (the
// checkpoints' parameter counts): Llama 2 70B 68,976,648,192, Llama 3 405B 405,853,388,800. The
// model counts GPT's biases and norms (9h + f per layer) where Llama has 2h: 7h + f too many per
// layer, under 0.01%; an output layer tied to the embedding would be 0.4% and 0.5% short.
TEST(sim_model, llama_parameters_are_the_published_counts) {
  const double llama2_70b = 68976648192.0, llama3_405b = 405853388800.0;
  EXPECT_NEAR(model_named("llama2-70b").parameters(), llama2_70b, 1e-4 * llama2_70b);
  EXPECT_NEAR(model_named("llama3-405b").parameters(), llama3_405b, 1e-4 * llama3_405b);
  EXPECT_NEAR(llama_shaped("llama", 80, 8192, 64, 8, 28672, 32000).parameters(), llama2_70b,
              1e-4 * llama2_70b);
}

// The other presets against the counts their sources give: GPT-3 175.0B (Brown et al. 2020,
// Table 2.1; the preset pads the vocabulary to 51,200 as Megatron-LM does, 0.4 B more than
// 50,257), MT-NLG 530B, SC21's 1T row 1,008.0B (Narayanan et al., Table 1), BLOOM
// 176,247,271,424 (its model card), Nemotron-4 340B (the count its name gives).
TEST(sim_model, presets_have_their_published_sizes) {
  for (const auto& [name, published] : {std::pair{"gpt3-175b", 175.0e9},
                                        {"mt-nlg-530b", 530e9},
                                        {"gpt-1t", 1008.0e9},
                                        {"bloom-176b", 176247271424.0},
                                        {"nemotron4-340b", 340e9}})
    EXPECT_NEAR(model_named(name).parameters(), published, 0.01 * published) << name;
  for (const weft::sim::model_preset& p : weft::sim::model_presets)
    EXPECT_EQ(model_named(p.name).name, p.name);
  try {
    (void)model_named("gpt-5");
    ADD_FAILURE() << "gpt-5 is no preset";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'gpt-5': expected one of gpt3-175b, "
                                         "mt-nlg-530b, gpt-1t, bloom-176b, llama2-70b, "
                                         "llama3-405b, nemotron4-340b"),
              std::string::npos)
        << e.what();
  }
}

// A family gives a shape its architecture, whatever it had: Llama's, as Meta's Llama 2 (its
// published count above), GPT's, as SC21's Eq. 2 counts it (tied, learned positions).
TEST(sim_model, a_family_gives_a_shape_its_architecture) {
  using weft::sim::model_family;
  const model_spec llama = weft::sim::with_architecture(
      gpt_shaped("llama2-70b", 80, 8192, 64, 32000, 4096), model_family::llama);
  EXPECT_TRUE(llama.gated && llama.flash_attention);
  EXPECT_FALSE(llama.learned_positions || llama.tied_embeddings || llama.dropout);
  model_spec shaped = llama;
  shaped.kv_heads = 8;
  shaped.ffn = 28672;
  EXPECT_EQ(shaped.parameters(), model_named("llama2-70b").parameters());
  const model_spec gpt = weft::sim::with_architecture(llama, model_family::gpt);
  EXPECT_EQ(gpt.parameters(), gpt_shaped("gpt", 80, 8192, 64, 32000, 4096).parameters());
  EXPECT_TRUE(gpt.learned_positions && gpt.tied_embeddings && gpt.dropout);
  EXPECT_FALSE(gpt.gated || gpt.flash_attention);
  for (model_family f : {model_family::gpt, model_family::llama})
    EXPECT_EQ(weft::sim::model_family_named(name_of(f)), f);
}

TEST(sim_model, flops_with_full_recompute_are_sc21_eq3) {
  const model_spec m = gpt_shaped("gpt", 105, 20480, 128, 50272);
  const double B = 1920, s = 2048, l = 105, h = 20480, V = 50272;
  const double eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(m.hardware_flops(B, recompute::full), eq3, eq3 * 1e-12);
  EXPECT_NEAR(weft::sim::sc21_flops(B, s, l, h, V), eq3, eq3 * 1e-12);
  // Without recompute: three passes, 72 B s l h^2 (1 + s/6h) + 6 B s h V.
  const double model = 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V;
  EXPECT_NEAR(m.model_flops(B), model, model * 1e-12);
  // MT-NLG (Smith et al. 2022): 60.1 s per iteration on 2,240 GPUs is 126 TFLOP/s per GPU.
  EXPECT_NEAR(eq3 / (60.1 * 2240) / 1e12, 126, 0.5);
}

TEST(sim_model, zero_paper_example) {
  // ZeRO section 5 / Figure 1: 7.5B parameters, mixed-precision Adam (K = 12), 64 GPUs.
  const double psi = 7.5e9;
  const double expected[] = {120, 31.4, 16.6, 1.9}; // GB, as the paper rounds them
  for (int stage = 0; stage <= 3; ++stage) {
    const auto mem = weft::sim::zero_memory(psi, 64, stage);
    EXPECT_NEAR(mem.total() / 1e9, expected[stage], 0.05) << "ZeRO-" << stage;
    std::printf("  7.5B parameters on 64 GPUs, ZeRO-%d: %.1f GB per GPU\n", stage,
                mem.total() / 1e9);
  }
  const auto z1 = weft::sim::zero_memory(psi, 64, 1);
  EXPECT_DOUBLE_EQ(z1.weights, 2 * psi);
  EXPECT_DOUBLE_EQ(z1.gradients, 2 * psi);
  EXPECT_DOUBLE_EQ(z1.optimizer, 12 * psi / 64);
  EXPECT_THROW((void)weft::sim::zero_memory(psi, 64, 4), weft::error);
  EXPECT_THROW((void)weft::sim::zero_memory(psi, 0, 1), weft::error);
}

TEST(sim_model, activation_memory_is_korthikanti_table2) {
  const model_spec m = gpt_shaped("gpt", 96, 12288, 96); // GPT-3 175B
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const auto act = [&](bool sp, recompute r) {
    return weft::sim::activation_bytes_per_layer(m, b, static_cast<int>(t), sp, r);
  };
  EXPECT_DOUBLE_EQ(act(false, recompute::none), s * b * h * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(act(true, recompute::none), s * b * h / t * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(act(false, recompute::selective), s * b * h * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(act(true, recompute::selective), s * b * h * 34 / t);
  EXPECT_DOUBLE_EQ(act(false, recompute::full), 2 * s * b * h);
  // No parallelism: s b h (34 + 5 a s / h).
  EXPECT_DOUBLE_EQ(weft::sim::activation_bytes_per_layer(m, b, 1, false, recompute::none),
                   s * b * h * (34 + 5 * a * s / h));
  // The paper's headline: selective recompute with sequence parallelism keeps about a fifth
  // of what tensor parallelism alone keeps for GPT-3 (its Figure 7: 5x less memory).
  const double ratio = act(false, recompute::none) / act(true, recompute::selective);
  EXPECT_GT(ratio, 4.5);
  EXPECT_LT(ratio, 6.5);
  // The same table at micro-batch 4 and 4-way TP: every entry is linear in b.
  const double b4 = 4, t4 = 4;
  const auto act4 = [&](bool sp, recompute r) {
    return weft::sim::activation_bytes_per_layer(m, b4, 4, sp, r);
  };
  EXPECT_DOUBLE_EQ(act4(false, recompute::none),
                   s * b4 * h * (10 + 24 / t4 + 5 * a * s / (h * t4)));
  EXPECT_DOUBLE_EQ(act4(true, recompute::none), s * b4 * h / t4 * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(act4(false, recompute::selective), s * b4 * h * (10 + 24 / t4));
  EXPECT_DOUBLE_EQ(act4(true, recompute::selective), s * b4 * h * 34 / t4);
  EXPECT_DOUBLE_EQ(act4(false, recompute::full), 2 * s * b4 * h);
  EXPECT_DOUBLE_EQ(act4(true, recompute::full), 2 * s * b4 * h / t4); // the input, split over TP
  // Flash attention keeps no a s^2 scores: what selective recompute keeps.
  model_spec flash = m;
  flash.flash_attention = true;
  EXPECT_DOUBLE_EQ(weft::sim::activation_bytes_per_layer(flash, b4, 4, true, recompute::none),
                   s * b4 * h * 34 / t4);
  EXPECT_DOUBLE_EQ(weft::sim::activation_bytes_per_layer(flash, b4, 4, false, recompute::none),
                   s * b4 * h * (10 + 24 / t4));
}

// Table 2's breakdown, tensor by tensor, for other FFN widths, a gated MLP and grouped-query
// attention (g = kv/a). Per layer, in 16-bit values unless a 1-byte mask: the two LayerNorms'
// inputs 4sbh; the QKV projection's input 2sbh, Q 2sbh, K and V 2sbh g each, the output
// projection's input 2sbh and its dropout mask sbh, the scores, softmax and dropout 5as^2b;
// the MLP's input 2sbh, its dropout mask sbh, and its f-wide tensors: GeLU's input and output
// 4sbf, or gated, the gate, the up projection and their product 6sbf. TP leaves whole Table 2's
// 10 sbh: the LayerNorms' inputs, the QKV projection's and the MLP's inputs, the two dropout
// masks (4 + 2 + 2 + 1 + 1); sequence parallelism splits those too.
TEST(sim_model, activation_memory_follows_the_ffn_width_the_gate_and_the_key_value_heads) {
  const double s = 2048, b = 2, h = 4096, a = 32;
  for (const int f : {4096, 16384, 65536}) {
    for (const bool gated : {false, true}) {
      for (const int kv : {32, 8}) {
        model_spec m = gpt_shaped("m", 24, 4096, 32);
        m.ffn = f;
        m.gated = gated;
        m.kv_heads = kv;
        const double g = kv / a, sbh = s * b * h, sbf = s * b * f;
        const double whole = 4 * sbh + 2 * sbh + 2 * sbh + 4 * sbh * g + 2 * sbh + sbh + 2 * sbh +
                             sbh + (gated ? 6 : 4) * sbf;
        const double kept = 10 * sbh, split = whole - kept, core = 5 * a * s * s * b;
        for (const int t : {1, 4}) {
          SCOPED_TRACE("f " + std::to_string(f) + (gated ? " gated" : "") + " kv " +
                       std::to_string(kv) + " t " + std::to_string(t));
          EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, b, t, false, recompute::none),
                           kept + (split + core) / t);
          EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, b, t, true, recompute::none),
                           (whole + core) / t);
          EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, b, t, false, recompute::selective),
                           kept + split / t);
          EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, b, t, true, recompute::selective),
                           whole / t);
        }
      }
    }
  }
}

TEST(sim_model, one_f_one_b_bubble_with_8_stages_and_64_microbatches_is_about_11_percent) {
  const auto s = weft::pipeline::one_f_one_b::make(8, 64);
  const auto st = weft::pipeline::analyze(s, weft::pipeline::costs{1, 2, 0});
  EXPECT_NEAR(st.bubble_over_ideal, 7.0 / 64, 1e-9); // (p - 1) / m = 10.9%
  EXPECT_NEAR(st.bubble_over_ideal, 0.11, 0.005);
  std::printf("  1F1B, 8 stages, 64 micro-batches: bubble %.1f%% of ideal compute\n",
              100 * st.bubble_over_ideal);
}

TEST(sim_model, bad_specs_throw) {
  model_spec m = gpt_shaped("gpt", 2, 64, 3);
  EXPECT_THROW(m.check(), weft::error); // 64 is not a multiple of 3 heads
  m = gpt_shaped("gpt", 0, 64, 4);
  EXPECT_THROW(m.check(), weft::error);
  EXPECT_THROW((void)weft::sim::recompute_named("some"), weft::error);
  EXPECT_EQ(weft::sim::recompute_named("selective"), recompute::selective);
}

} // namespace
