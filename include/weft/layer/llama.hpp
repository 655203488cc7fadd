#pragma once
// The Llama model over a tensor-parallel group, as a weft model (model.hpp):
//
//   token embedding (vocab-parallel; no position embedding)
//     -> `layers` pre-RMSNorm blocks: grouped-query attention with rotary q and k, no biases;
//        SwiGLU MLP (gate and up column-parallel, down row-parallel)
//     -> final RMSNorm -> output layer (column-parallel, untied unless tie_embeddings)
//     -> vocab-parallel cross entropy
//
//   weft::layer::llama<float, weft::local::communicator> model(
//       tp, {.vocab = 32000, .hidden = 4096, .heads = 32, .kv_heads = 8, .ffn = 14336,
//            .seq = 4096, .layers = 32, .rope_theta = 500000}, seed);
//
// Over TP the query heads split evenly; key/value heads split too when TP divides them, and are
// replicated on the ranks whose query heads use them when TP exceeds them (attention.hpp).
// weft::strategy<..., weft::layer::llama_model> trains it over TP x PP x DP. Initialisation as
// for GPT (gpt.hpp): N(0, init_std^2), the attention output and MLP down projections
// N(0, init_std^2 / (2 layers)), norms 1. Tensor ids: token table 0, block l from 1 + 8 l (the
// attention's first, the MLP's from 1 + 8 l + 4), output layer 1 + 8 layers (the table's when
// tied).
#include <weft/comm/communicator.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/lm_head.hpp>
#include <weft/layer/model.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>
#include <weft/layer/rms_norm.hpp>
#include <weft/layer/swiglu_mlp.hpp>
#include <weft/layer/weights.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

struct llama_config {
  std::size_t vocab = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t kv_heads = 0; // 0: as many as heads
  std::size_t ffn =
      0; // the SwiGLU width; 0: Llama's rule, 2/3 of 4 hidden rounded up to a multiple of 256
  std::size_t seq = 0;
  std::size_t layers = 0;
  double rope_theta = 10000; // Llama 2; Llama 3 uses 500000
  double norm_eps = 1e-5;
  double init_std = 0.02;
  bool tie_embeddings = false;
  bool decay_embeddings = true;
  std::int32_t ignore_index = -100;

  /// The SwiGLU width this configuration uses.
  [[nodiscard]] constexpr std::size_t ffn_size() const noexcept {
    if (ffn != 0) return ffn;
    const std::size_t d = 2 * (4 * hidden) / 3;
    return (d + 255) / 256 * 256;
  }
};

/// The token embedding alone: "wte." parameters (Hugging Face's embed_tokens).
template <class T, communicator Comm, class Gemm, class SP>
class llama_embedding {
public:
  llama_embedding(Comm& tp, const llama_config& c, std::uint64_t seed, Gemm gemm = {})
      : decay_(c.decay_embeddings), tokens_(tp, c.vocab, c.hidden, seed, 0, c.init_std, gemm) {}

  void forward(std::span<const std::int32_t> ids, matrix_view<T> y) { tokens_.forward(ids, y); }
  void backward(matrix_view<const T> dy) { tokens_.backward(dy); }
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    append_parameters(ps, "wte.", tokens_.parameters());
    for (auto& p : ps)
      p.decay = decay_;
    return ps;
  }
  void zero_grad() { tokens_.zero_grad(); }
  [[nodiscard]] parameter<T> tied_weight() { return tokens_.parameters()[0]; }

  using activations = typename vocab_parallel_embedding<T, Comm, SP, Gemm>::activations;
  [[nodiscard]] activations stash() { return tokens_.stash(); }
  void restore(activations a) { tokens_.restore(std::move(a)); }

private:
  bool decay_;
  vocab_parallel_embedding<T, Comm, SP, Gemm> tokens_;
};

/// Block `layer` of a Llama: RMSNorms, grouped-query rotary attention without biases, SwiGLU.
template <class T, communicator Comm, class Gemm, class SP, class Recompute>
class llama_block
    : public basic_transformer_block<T, Comm, Gemm, SP, Recompute, rms_norm<T, SP, Gemm>,
                                     parallel_swiglu_mlp<T, Comm, Gemm, SP>> {
  using base = basic_transformer_block<T, Comm, Gemm, SP, Recompute, rms_norm<T, SP, Gemm>,
                                       parallel_swiglu_mlp<T, Comm, Gemm, SP>>;

public:
  static constexpr std::uint64_t tensor_ids = 8;

  llama_block(Comm& tp, const llama_config& c, std::size_t layer, std::uint64_t seed,
              Gemm gemm = {})
      : base(tp, block_shape{c.hidden, c.heads, c.ffn_size(), c.seq}, seed, 1 + tensor_ids * layer,
             block_options{.init_std = c.init_std,
                           .out_init_std = detail::residual_init_std(c.init_std, c.layers),
                           .norm_eps = c.norm_eps,
                           .kv_heads = c.kv_heads,
                           .attention_bias = false,
                           .rope_theta = c.rope_theta,
                           .mlp_tensor_offset = 4},
             gemm) {}
};

/// Final RMSNorm, output layer, loss.
template <class T, communicator Comm, class Gemm, class SP>
class llama_head : public lm_head<T, Comm, Gemm, SP, rms_norm<T, SP, Gemm>> {
public:
  llama_head(Comm& tp, const llama_config& c, std::uint64_t seed, Gemm gemm = {})
      : lm_head<T, Comm, Gemm, SP, rms_norm<T, SP, Gemm>>(
            tp,
            {.hidden = c.hidden,
             .vocab = c.vocab,
             .tensor_id =
                 c.tie_embeddings
                     ? 0
                     : 1 + llama_block<T, Comm, Gemm, SP, recompute::none>::tensor_ids * c.layers,
             .init_std = c.init_std,
             .norm_eps = c.norm_eps,
             .ignore_index = c.ignore_index,
             .output_decay = !c.tie_embeddings || c.decay_embeddings},
            seed, gemm) {}
};

/// The Llama model family (model.hpp).
struct llama_model {
  using config = llama_config;
  template <class T, communicator Comm, class Gemm, class SP, class Recompute>
  struct parts {
    using embedding = llama_embedding<T, Comm, Gemm, SP>;
    using block = llama_block<T, Comm, Gemm, SP, Recompute>;
    using head = llama_head<T, Comm, Gemm, SP>;
  };
  static constexpr bool tied(const config& c) noexcept { return c.tie_embeddings; }

  /// Hugging Face's LlamaForCausalLM names (weights.hpp); every matrix out x in as weft holds
  /// it. The rotation is Hugging Face's rotate-half convention, so its q_proj and k_proj load as
  /// they are (Meta's original checkpoints permute them). A tied output layer is the token table.
  static stored_tensor stored(const config& c, const std::string& name) {
    if (name == "embedding.wte.weight") return {"model.embed_tokens.weight"};
    if (name == "head.norm.weight") return {"model.norm.weight"};
    if (name == "head.output.weight") {
      return c.tie_embeddings ? stored_tensor{"model.embed_tokens.weight", false, {}, false}
                              : stored_tensor{"lm_head.weight"};
    }
    const auto [l, part] = detail::split_block_name(name);
    if (l < 0) detail::unknown_parameter("llama_model", name);
    const std::string h = "model.layers." + std::to_string(l) + ".";
    if (part == "ln1.weight") return {h + "input_layernorm.weight"};
    if (part == "ln2.weight") return {h + "post_attention_layernorm.weight"};
    for (const char* p : {"q", "k", "v", "o"}) {
      for (const char* w : {"weight", "bias"}) {
        if (part == std::string("attention.") + p + "." + w)
          return {h + "self_attn." + p + "_proj." + w};
      }
    }
    for (const char* p : {"gate", "up", "down"}) {
      if (part == std::string("mlp.") + p + ".weight") return {h + "mlp." + p + "_proj.weight"};
    }
    detail::unknown_parameter("llama_model", name);
  }

  /// What decides how the tensors read: which query heads share a key/value head, the rotation.
  static std::map<std::string, std::string> describe(const config& c) {
    return {{"model", "llama"},
            {"heads", std::to_string(c.heads)},
            {"kv_heads", std::to_string(c.kv_heads == 0 ? c.heads : c.kv_heads)},
            {"rope_theta", detail::exact(c.rope_theta)},
            {"norm_eps", detail::exact(c.norm_eps)},
            {"tie_embeddings", c.tie_embeddings ? "true" : "false"}};
  }
  /// Older conversions carry each layer's rotary frequencies as a tensor.
  static bool buffer(std::string_view name) {
    constexpr std::string_view tail = ".rotary_emb.inv_freq";
    return name.size() >= tail.size() && name.substr(name.size() - tail.size()) == tail;
  }
};

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel,
          recompute::policy Recompute = recompute::none>
using llama = sequential<llama_model, T, Comm, Gemm, SP, Recompute>;

} // namespace weft::layer
