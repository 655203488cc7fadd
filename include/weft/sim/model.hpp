#pragma once
// The transformer the simulator trains: its shape, its parameter count and FLOPs (Narayanan
// et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// SC21, arXiv:2104.04473, Eq. 2 and 3), its activation memory per layer (Korthikanti et al.,
// "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, 2022,
// Table 2) and the per-GPU memory of weights, gradients and optimizer state under ZeRO
// (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", SC20, arXiv:1910.02054, section 5 and Figure 1).
//
//   one layer, per token, forward FLOPs (2 per multiply-add), h hidden, a heads, g KV heads,
//   f FFN size, s sequence:
//     QKV        2 h (h + 2 h g / a)        attention out   2 h h
//     MLP        2 h f (x2, x3 if gated)    attention core  4 s h  (QK^T and AV, no causal saving)
//   GPT (g = a, f = 4h, not gated): 24 h^2 + 4 s h = 24 h^2 (1 + s / 6h), SC21's count.
//   Logits: 2 h V per token. Backward: twice the forward. Full recompute: one more forward
//   of the layers (not of the logits): SC21 Eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh).
#include <weft/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace weft::sim {

/// Activation recomputation (Korthikanti et al. 2022).
enum class recompute : std::uint8_t {
  none,      // store every activation
  selective, // recompute the attention core (QK^T, softmax, dropout, AV) only
  full,      // store each layer's input, recompute the whole layer in the backward
};

[[nodiscard]] constexpr std::string_view name_of(recompute r) noexcept {
  switch (r) {
    case recompute::none: return "none";
    case recompute::selective: return "selective";
    case recompute::full: return "full";
  }
  return "?";
}

[[nodiscard]] inline recompute recompute_named(std::string_view s) {
  for (recompute r : {recompute::none, recompute::selective, recompute::full})
    if (name_of(r) == s) return r;
  throw error("weft: sim: unknown recompute '" + std::string(s) +
              "': expected none, selective or full");
}

/// A decoder-only transformer.
struct model_spec {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int seq = 0;
  int vocab = 0;
  int ffn = 0;                   // 0: 4 * hidden
  int kv_heads = 0;              // 0: heads (no grouped-query attention)
  bool gated = false;            // SwiGLU-style MLP: three h x f matrices instead of two
  bool learned_positions = true; // a position embedding of seq x hidden (GPT); false: rotary
  bool tied_embeddings = true;   // the output layer is the word embedding (GPT); false: its own
                                 // vocab x hidden weights (Llama, Nemotron)
  bool flash_attention = false;  // attention core fused: no s x s matrices in memory
  bool dropout = true; // dropout after attention and the MLP and on the attention probabilities
                       // (GPT-3, MT-NLG); false: none, and none of its masks kept (Llama,
                       // Nemotron-4: PyTorch's dropout at p = 0 returns its input)

  [[nodiscard]] double h() const noexcept { return hidden; }
  [[nodiscard]] double f() const noexcept { return ffn > 0 ? ffn : 4.0 * hidden; }
  [[nodiscard]] double kv() const noexcept { return kv_heads > 0 ? kv_heads : heads; }
  [[nodiscard]] double mlp_matrices() const noexcept { return gated ? 3.0 : 2.0; }
  /// Width of the fused QKV projection's output.
  [[nodiscard]] double qkv_width() const noexcept { return h() * (1.0 + 2.0 * kv() / heads); }

  /// Throws weft::error naming the first field out of range.
  void check() const {
    const auto positive = [&](const char* what, int v) {
      if (v < 1)
        throw error("weft: sim: model " + name + ": " + what + " must be at least 1, not " +
                    std::to_string(v));
    };
    positive("layers", layers);
    positive("hidden", hidden);
    positive("heads", heads);
    positive("seq", seq);
    positive("vocab", vocab);
    if (ffn < 0 || kv_heads < 0)
      throw error("weft: sim: model " + name + ": ffn and kv_heads must not be negative");
    if (hidden % heads != 0)
      throw error("weft: sim: model " + name + ": hidden " + std::to_string(hidden) +
                  " is not a multiple of heads " + std::to_string(heads));
    if (kv_heads > 0 && heads % kv_heads != 0)
      throw error("weft: sim: model " + name + ": heads " + std::to_string(heads) +
                  " is not a multiple of kv_heads " + std::to_string(kv_heads));
  }

  /// Weights of one layer: projections, MLP, biases and two layer norms (13 h for GPT).
  [[nodiscard]] double layer_parameters() const noexcept {
    return h() * qkv_width() + h() * h() + mlp_matrices() * h() * f() + 9.0 * h() + f();
  }

  /// All weights: the layers, the word embedding, the output layer where it is not tied to the
  /// embedding, and the position embedding. For GPT this is SC21 Eq. 2,
  /// P = 12 l h^2 (1 + 13/12h + (V + s)/12lh). (Biases and norms are counted as GPT has them,
  /// 9h + f per layer: a few millionths of a Llama's count too many.)
  [[nodiscard]] double parameters() const noexcept {
    return layers * layer_parameters() +
           (tied_embeddings ? 1.0 : 2.0) * static_cast<double>(vocab) * h() +
           (learned_positions ? static_cast<double>(seq) * h() : 0.0);
  }

  /// Forward FLOPs of one layer per token, split into the GEMMs and the attention core.
  [[nodiscard]] double layer_gemm_flops_per_token() const noexcept {
    return 2.0 * h() * qkv_width() + 2.0 * h() * h() + 2.0 * mlp_matrices() * h() * f();
  }
  [[nodiscard]] double layer_attention_flops_per_token() const noexcept {
    return 4.0 * static_cast<double>(seq) * h();
  }
  [[nodiscard]] double logit_flops_per_token() const noexcept {
    return 2.0 * h() * static_cast<double>(vocab);
  }

  /// Model FLOPs of one iteration of `batch` sequences: forward and backward, no recompute.
  [[nodiscard]] double model_flops(double batch) const noexcept {
    const double tokens = batch * seq;
    return 3.0 * tokens *
           (layers * (layer_gemm_flops_per_token() + layer_attention_flops_per_token()) +
            logit_flops_per_token());
  }

  /// FLOPs the hardware runs with recomputation: full adds one forward of every layer,
  /// selective one forward of the attention core.
  [[nodiscard]] double hardware_flops(double batch, recompute r) const noexcept {
    const double tokens = batch * seq;
    double extra = 0;
    if (r == recompute::full)
      extra = layer_gemm_flops_per_token() + layer_attention_flops_per_token();
    if (r == recompute::selective) extra = layer_attention_flops_per_token();
    return model_flops(batch) + tokens * layers * extra;
  }
};

/// The architectures a model of a given shape can have: gpt, as Megatron-LM and DeepSpeed trained
/// GPT-3 and MT-NLG (learned positions, an output layer tied to the word embedding, a GELU MLP of
/// 4 h unless the shape says otherwise, dropout, the attention core unfused), or llama (rotary
/// positions, a SwiGLU MLP, an output layer of its own, no dropout, as Llama 2 and 3 train; the
/// attention core fused).
enum class model_family : std::uint8_t { gpt, llama };

[[nodiscard]] constexpr std::string_view name_of(model_family f) noexcept {
  return f == model_family::llama ? "llama" : "gpt";
}

[[nodiscard]] inline model_family model_family_named(std::string_view s) {
  for (model_family f : {model_family::gpt, model_family::llama})
    if (name_of(f) == s) return f;
  throw error("weft: sim: unknown model family '" + std::string(s) + "': expected gpt or llama");
}

/// Llama's MLP width for `hidden` where its configuration gives none: two thirds of 4 hidden,
/// rounded up to a multiple of 256 (11,008 for 4,096).
[[nodiscard]] constexpr int llama_ffn(int hidden) noexcept {
  return (2 * (4 * hidden) / 3 + 255) / 256 * 256;
}
static_assert(llama_ffn(4096) == 11008 && llama_ffn(5120) == 13824);

/// `m`'s shape (layers, hidden, heads, seq, vocab, ffn, kv_heads) with family `f`'s architecture;
/// ffn stays as given (0: 4 hidden, as model_spec counts it, under either family).
[[nodiscard]] inline model_spec with_architecture(model_spec m, model_family f) noexcept {
  const bool llama = f == model_family::llama;
  m.gated = llama;
  m.learned_positions = !llama;
  m.tied_embeddings = !llama;
  m.dropout = !llama;
  m.flash_attention = llama;
  return m;
}

/// A GPT-style model (model_family::gpt) from its shape.
[[nodiscard]] inline model_spec gpt_shaped(std::string name, int layers, int hidden, int heads,
                                           int vocab = 51200, int seq = 2048) {
  model_spec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq = seq;
  m.vocab = vocab;
  return with_architecture(m, model_family::gpt);
}

/// A Llama-style model (model_family::llama) from its shape: a SwiGLU MLP of width `ffn` (0: 4 h),
/// `kv_heads` key-value heads (0: one per head).
[[nodiscard]] inline model_spec llama_shaped(std::string name, int layers, int hidden, int heads,
                                             int kv_heads, int ffn, int vocab = 32000,
                                             int seq = 4096) {
  model_spec m = gpt_shaped(std::move(name), layers, hidden, heads, vocab, seq);
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  return with_architecture(m, model_family::llama);
}

/// A model `weft-plan --model` names, as its paper or model card gives it.
struct model_preset {
  std::string_view name;
  model_spec (*make)(); // the model, unnamed
};

inline constexpr model_preset model_presets[] = {
    // GPT-3 175B (Brown et al. 2020, Table 2.1), the vocabulary padded to 51,200 as Megatron-LM
    // pads GPT-2's 50,257.
    {"gpt3-175b", [] { return gpt_shaped({}, 96, 12288, 96, 51200); }},
    {"mt-nlg-530b", [] { return gpt_shaped({}, 105, 20480, 128, 50272); }},
    {"gpt-1t", [] { return gpt_shaped({}, 128, 25600, 160, 51200); }},
    {"bloom-176b",
     [] { // ALiBi positions, no dropout (its config's hidden and attention dropout are 0)
       model_spec m = gpt_shaped({}, 70, 14336, 112, 250880);
       m.learned_positions = false;
       m.dropout = false;
       return m;
     }},
    {"llama2-70b", [] { return llama_shaped({}, 80, 8192, 64, 8, 28672, 32000, 4096); }},
    {"llama3-405b", [] { return llama_shaped({}, 126, 16384, 128, 8, 53248, 128256, 8192); }},
    {"nemotron4-340b",
     [] { // rotary, grouped-query and untied like Llama, but a squared-ReLU MLP of 4 h
       model_spec m = llama_shaped({}, 96, 18432, 96, 8, 73728, 256000, 4096);
       m.gated = false;
       return m;
     }},
};

/// The preset named `name` (model_presets).
[[nodiscard]] inline model_spec model_named(std::string_view name) {
  std::string known;
  for (const model_preset& p : model_presets) {
    if (p.name == name) {
      model_spec m = p.make();
      m.name = std::string(name);
      return m;
    }
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw error("weft: sim: unknown model '" + std::string(name) + "': expected one of " + known);
}

/// SC21 Eq. 2: P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)).
[[nodiscard]] constexpr double sc21_parameters(double l, double h, double V, double s) noexcept {
  return 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (V + s) / (12.0 * l * h));
}

/// SC21 Eq. 3: F = 96 B s l h^2 (1 + s/(6 h) + V/(16 l h)), FLOPs of one iteration with full
/// recomputation; Megatron-LM reports "TFLOP/s per GPU" as F / (iteration time * GPUs) in
/// this convention whatever the recomputation.
[[nodiscard]] constexpr double sc21_flops(double B, double s, double l, double h,
                                          double V) noexcept {
  return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

/// Korthikanti et al. 2022, Table 2: bytes of activations one layer keeps for the backward,
/// per micro-batch of b sequences, with t-way tensor parallelism (t = 1: none), sequence
/// parallelism or not, and the recomputation. 16-bit activations, 1-byte dropout masks.
///   none          s b h (10 + 24/t + 5 a s/(h t))    with SP: s b h/t (34 + 5 a s/h)
///   selective     s b h (10 + 24/t)                  with SP: 34 s b h/t
///   full          2 s b h (the layer's input)        with SP: 2 s b h/t
/// Flash attention keeps no a s^2 term: it stores what selective recompute stores.
/// Without dropout (model_spec::dropout false) the two 1-byte masks of the 10 sbh go, and of the
/// 5 a s^2 b the mask (a s^2 b) and the dropped probabilities (2 a s^2 b): the product with V
/// keeps the softmax's output (2 a s^2 b) itself.
/// The 24 is the tensor-parallel part of Table 2's breakdown, for f = 4h, no gating and as many
/// key-value heads as heads: Q 2sbh, K and V 2sbh each, the output projection's input 2sbh, and
/// the MLP's two f-wide tensors 4sbf (GeLU's input and output). In general, with g = kv/a:
/// (4 + 4g) sbh + 4sbf, or 6sbf gated (gate, up and their product).
[[nodiscard]] inline double activation_bytes_per_layer(const model_spec& m, double b, int t,
                                                       bool sequence_parallel, recompute r) {
  const double s = m.seq, h = m.h(), a = m.heads, tt = t;
  const double sbh = s * b * h;
  if (r == recompute::full) return sequence_parallel ? 2.0 * sbh / tt : 2.0 * sbh;
  const bool core_kept = r == recompute::none && !m.flash_attention;
  const double core = core_kept ? (m.dropout ? 5.0 : 2.0) * a * s / h : 0.0;
  const double split = 4.0 + 4.0 * m.kv() / a + (m.gated ? 6.0 : 4.0) * m.f() / h; // 24 for GPT
  const double replicated = m.dropout ? 10.0 : 8.0; // layer norms' inputs 4, the inputs of QKV and
                                                    // the MLP 4, the masks 2
  if (sequence_parallel) return sbh / tt * (replicated + split + core);
  return sbh * (replicated + split / tt + core / tt);
}

/// Bytes per GPU of the model states with mixed-precision Adam: 2 bytes of 16-bit weights,
/// `grad_bytes` of gradients and `optimizer_bytes` of optimizer state per parameter (K = 12 by
/// default: fp32 master weights, momentum and variance), each divided by the GPUs it is sharded
/// over. ZeRO stage 1 shards the optimizer state over the data-parallel group, 2 the gradients
/// too, 3 the weights too (ZeRO, section 5: 7.5B parameters on 64 GPUs give 120, 31.4, 16.6,
/// 1.9 GB); HSDP shards the same three over its shard group instead, and replicates them across
/// the groups.
struct state_memory {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  [[nodiscard]] double total() const noexcept { return weights + gradients + optimizer; }
};

inline constexpr double adam_state_bytes = 12;

/// GPUs each model state is divided over (1: every GPU holds all of it).
struct state_shards {
  int weights = 1;
  int gradients = 1;
  int optimizer = 1;
};

/// ZeRO stage `stage`'s sharding over `group` GPUs: the optimizer state from stage 1, the
/// gradients from 2, the weights at 3.
[[nodiscard]] inline state_shards zero_shards(int stage, int group) {
  if (stage < 0 || stage > 3)
    throw error("weft: sim: ZeRO stage must be 0, 1, 2 or 3, not " + std::to_string(stage));
  if (group < 1)
    throw error("weft: sim: data-parallel degree must be at least 1, not " + std::to_string(group));
  return {.weights = stage >= 3 ? group : 1,
          .gradients = stage >= 2 ? group : 1,
          .optimizer = stage >= 1 ? group : 1};
}

/// The model states of `params` parameters, each divided by the GPUs `s` shards it over.
[[nodiscard]] inline state_memory state_memory_of(double params, const state_shards& s,
                                                  double grad_bytes = 2,
                                                  double optimizer_bytes = adam_state_bytes) {
  if (s.weights < 1 || s.gradients < 1 || s.optimizer < 1)
    throw error("weft: sim: model states are sharded over at least 1 GPU, not " +
                std::to_string(std::min({s.weights, s.gradients, s.optimizer})));
  return {.weights = 2.0 * params / s.weights,
          .gradients = grad_bytes * params / s.gradients,
          .optimizer = optimizer_bytes * params / s.optimizer};
}

/// ZeRO stage `stage` over `dp` data-parallel ranks.
[[nodiscard]] inline state_memory zero_memory(double params, int dp, int stage,
                                              double grad_bytes = 2) {
  return state_memory_of(params, zero_shards(stage, dp), grad_bytes);
}

} // namespace weft::sim
