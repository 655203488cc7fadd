// A Llama that moves from one rank to a 3D mesh through a weights file, and a model of this file's
// own block trained over tensor and pipeline parallelism.
//
//   1. A small Llama (RMSNorm, grouped-query rotary attention, SwiGLU) trains a few steps on one
//      rank (weft::strategy over mesh<tp<1>, pp<1>, dp<1>>) and saves its weights with
//      save_weights: one safetensors file under Hugging Face's Llama names, loadable by
//      transformers.
//   2. A trainer at TP2 x PP2 x DP2 on 8 in-process ranks, initialised from another seed, loads
//      that file with load_weights (every rank reads only its own slices) and trains on. Its first
//      loss is the one-rank trainer's loss on the same batch: the same weights, split 8 ways.
//      (Only the weights travel; the AdamW moments start again from zero, so later steps differ.)
//   3. post_norm_mlp_model: weft's GPT embedding and head around a block defined below, trained at
//      TP2 x PP2 x DP1 next to one rank: the same losses.
// It exits 1 when a comparison fails.
//
//   build/samples/12_train_llama/weft_train_llama [--weights FILE]
#include <weft/comm/transport/local.hpp>
#include <weft/io/safetensors.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/llama.hpp>
#include <weft/layer/rms_norm.hpp>
#include <weft/layer/swiglu_mlp.hpp>
#include <weft/strategy.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace wl = weft::layer;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;

constexpr std::size_t global_batch = 8; // sequences per step
constexpr weft::optim::adamw rule{
    .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};

struct batch {
  std::vector<std::int32_t> ids, targets;
};

// Step s's sequences: each counts through the vocabulary by a stride of 1 to 8 from a random
// start, so that the next token follows from the last two and the loss can fall.
batch batch_of(int s, std::size_t vocab, std::size_t seq) {
  batch b;
  std::uint64_t x = 0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(s + 1);
  for (std::size_t q = 0; q < global_batch; ++q) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    const std::uint64_t start = x % vocab;
    const std::uint64_t stride = 1 + (x >> 24) % 8;
    for (std::size_t t = 0; t <= seq; ++t) {
      const auto id = static_cast<std::int32_t>((start + stride * t) % vocab);
      if (t < seq) b.ids.push_back(id);
      if (t > 0) b.targets.push_back(id);
    }
  }
  return b;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

// --- 1 and 2: a Llama, one rank to TP2 x PP2 x DP2 -------------------------------------------

constexpr wl::llama_config llama{.vocab = 512,
                                 .hidden = 128,
                                 .heads = 8,
                                 .kv_heads = 2,
                                 .ffn = 0,
                                 .seq = 64,
                                 .layers = 4,
                                 .rope_theta = 10000};
using llama_1 =
    weft::strategy<mesh<tp<1>, pp<1>, dp<1>>, weft::pipeline::one_f_one_b, weft::optim::zero<0>,
                   wl::recompute::none, wl::no_sequence_parallel, wl::llama_model>;
using llama_3d =
    weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, weft::pipeline::one_f_one_b, weft::optim::zero<1>,
                   wl::recompute::selective, wl::no_sequence_parallel, wl::llama_model>;
constexpr int steps_before = 10; // on one rank, before saving
constexpr int steps_after = 4;   // at TP2 x PP2 x DP2, after loading

// Returns whether the loaded trainer's first loss is the one-rank trainer's.
bool llama_from_one_rank_to_3d(const std::string& path) {
  std::printf(
      "1. a Llama (vocabulary %zu, hidden %zu, %zu heads sharing %zu key/value heads, SwiGLU %zu, "
      "sequence "
      "%zu, %zu layers)\n   trained on 1 rank, %zu sequences per step:\n",
      llama.vocab, llama.hidden, llama.heads, llama.kv_heads, llama.ffn_size(), llama.seq,
      llama.layers, global_batch);
  double next_on_one = 0; // the saved weights' loss on the next batch
  weft::local::run(1, [&](weft::local::communicator& one) {
    auto trainer = llama_1::make(
        one, {.model = llama, .micro_batch = global_batch, .global_batch = global_batch, .seed = 3},
        rule);
    for (int s = 0; s < steps_before; ++s) {
      const batch b = batch_of(s, llama.vocab, llama.seq);
      std::printf("   step %2d   loss %.6f\n", s + 1, trainer->train_step(b.ids, b.targets));
    }
    trainer->save_weights(path);
    const batch b = batch_of(steps_before, llama.vocab, llama.seq);
    next_on_one = trainer->train_step(b.ids, b.targets);
  });
  const weft::safetensors::header h = weft::safetensors::read_header(path);
  std::printf("   saved to %s: %zu tensors (%s, %s, ..., %s)\n\n", path.c_str(), h.tensors.size(),
              h.tensors.front().name.c_str(), h.tensors[1].name.c_str(),
              h.tensors.back().name.c_str());

  std::printf(
      "2. loaded into TP 2 x PP 2 x DP 2 on 8 in-process ranks (initialised from another seed "
      "first),\n"
      "   ZeRO-1, training on:\n");
  std::vector<double> losses;
  weft::local::run(llama_3d::size, [&](weft::local::communicator& world) {
    auto trainer = llama_3d::make(
        world, {.model = llama, .micro_batch = 1, .global_batch = global_batch, .seed = 99}, rule);
    trainer->load_weights(path); // collective: every rank reads its own slices
    for (int s = steps_before; s < steps_before + steps_after; ++s) {
      const batch b = batch_of(s, llama.vocab, llama.seq);
      const double loss = trainer->train_step(b.ids, b.targets);
      if (world.rank() == 0) losses.push_back(loss);
    }
  });
  const double diff = relative(losses.front(), next_on_one);
  // The same weights on the same batch; only the order of the float sums differs (tensor
  // parallelism splits the attention heads, the MLP and the softmax's sums): far below 1e-5.
  const bool same = diff <= 1e-5;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    std::printf("   step %2zu   loss %.6f", steps_before + i + 1, losses[i]);
    if (i == 0) std::printf("   (1 rank, the saved weights on this batch: %.6f)", next_on_one);
    std::printf("\n");
  }
  std::printf("   the first loss after loading is %s: relative difference %.1e (bound 1e-5)\n\n",
              same ? "the same loss as the one-rank trainer's" : "NOT the one-rank trainer's",
              diff);
  return same;
}

// --- 3: a block of this file's own -----------------------------------------------------------

// y = RMSNorm(x + SwiGLU(x)): an MLP-only block whose norm comes after the residual sum (post-norm,
// as in the original Transformer) rather than before the branch (pre-norm, as GPT-2 and Llama).
// The tensor-parallel SwiGLU is weft's (gate and up split by columns, down by rows, one all-reduce
// in forward and one in backward); the norm, replicated over TP, and the residual are wired here.
// It keeps everything its backward needs, whatever the recompute policy.
template <class T, weft::communicator Comm, class Gemm, class SP, class Recompute>
class post_norm_mlp_block {
public:
  // Tensor ids (layer/init.hpp) 1 + 4 layer .. 3 + 4 layer, as a GPT block's, past the embedding's.
  post_norm_mlp_block(Comm& tp, const wl::gpt_config& c, std::size_t layer, std::uint64_t seed,
                      Gemm gemm)
      : mlp_(tp, c.hidden, c.ffn, seed, 1 + 4 * layer,
             {.init_std = c.init_std,
              .out_init_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers))},
             gemm),
        norm_(c.hidden, c.norm_eps, gemm) {}

  void forward(weft::matrix_view<const T> x, weft::matrix_view<T> y) {
    weft::matrix<T> sum(x.rows(), x.cols());
    mlp_.forward(x, sum.view());
    for (std::size_t i = 0; i < x.rows(); ++i)
      for (std::size_t j = 0; j < x.cols(); ++j)
        sum(i, j) += x(i, j);
    norm_.forward(sum, y);
  }
  // dx = d(sum) + SwiGLU's backward of d(sum), d(sum) the norm's backward of dy.
  void backward(weft::matrix_view<const T> dy, weft::matrix_view<T> dx) {
    weft::matrix<T> dsum(dy.rows(), dy.cols());
    norm_.backward(dy, dsum.view());
    mlp_.backward(dsum, dx);
    for (std::size_t i = 0; i < dx.rows(); ++i)
      for (std::size_t j = 0; j < dx.cols(); ++j)
        dx(i, j) += dsum(i, j);
  }
  [[nodiscard]] std::vector<wl::parameter<T>> parameters() {
    std::vector<wl::parameter<T>> ps;
    wl::append_parameters(ps, "mlp.", mlp_.parameters());
    wl::append_parameters(ps, "norm.", norm_.parameters());
    return ps;
  }
  void zero_grad() {
    mlp_.zero_grad();
    norm_.zero_grad();
  }

  // What backward needs from forward, one set per microbatch in flight (the pipeline keeps them).
  struct activations {
    typename wl::parallel_swiglu_mlp<T, Comm, Gemm, SP>::activations mlp;
    typename wl::rms_norm<T, SP, Gemm>::activations norm;
  };
  activations stash() { return {mlp_.stash(), norm_.stash()}; }
  void restore(activations a) {
    mlp_.restore(std::move(a.mlp));
    norm_.restore(std::move(a.norm));
  }

private:
  wl::parallel_swiglu_mlp<T, Comm, Gemm, SP> mlp_;
  wl::rms_norm<T, SP, Gemm> norm_;
};

// The model family (layer/model.hpp): GPT's token and position embeddings and its head (final
// LayerNorm, output layer, vocab-parallel cross entropy) around post_norm_mlp_blocks.
struct post_norm_mlp_model {
  using config = wl::gpt_config;
  template <class T, weft::communicator Comm, class Gemm, class SP, class Recompute>
  struct parts {
    using embedding = wl::gpt_embedding<T, Comm, Gemm, SP>;
    using block = post_norm_mlp_block<T, Comm, Gemm, SP, Recompute>;
    using head = wl::gpt_head<T, Comm, Gemm, SP>;
  };
};

constexpr wl::gpt_config own{
    .vocab = 512, .hidden = 128, .heads = 8, .ffn = 256, .seq = 64, .layers = 4};
constexpr int own_steps = 6;

template <class Mesh>
using own_strategy =
    weft::strategy<Mesh, weft::pipeline::one_f_one_b, weft::optim::zero<1>, wl::recompute::none,
                   wl::no_sequence_parallel, post_norm_mlp_model>;

template <class S>
std::vector<double> own_losses(std::size_t micro_batch) {
  std::vector<double> losses;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto trainer = S::make(
        world, {.model = own, .micro_batch = micro_batch, .global_batch = global_batch, .seed = 5},
        rule);
    for (int s = 0; s < own_steps; ++s) {
      const batch b = batch_of(s, own.vocab, own.seq);
      const double loss = trainer->train_step(b.ids, b.targets);
      if (world.rank() == 0) losses.push_back(loss);
    }
  });
  return losses;
}

bool own_block_at_2x2x1() {
  std::printf(
      "3. a model of this sample's own block, y = RMSNorm(x + SwiGLU(x)), between GPT's embedding "
      "and head\n"
      "   (%zu blocks, hidden %zu, SwiGLU %zu), at TP 2 x PP 2 x DP 1 on 4 in-process ranks and on "
      "1 rank:\n",
      own.layers, own.hidden, own.ffn);
  const auto on_one = own_losses<own_strategy<mesh<tp<1>, pp<1>, dp<1>>>>(global_batch);
  const auto on_four = own_losses<own_strategy<mesh<tp<2>, pp<2>, dp<1>>>>(2);
  std::printf("   step   loss, 4 ranks   loss, 1 rank   relative difference\n");
  double worst = 0;
  bool finite = true;
  for (std::size_t i = 0; i < on_one.size(); ++i) {
    const double d = relative(on_four[i], on_one[i]);
    finite = finite && std::isfinite(d);
    worst = std::max(worst, d);
    std::printf("   %4zu   %13.6f   %12.6f   %19.1e\n", i + 1, on_four[i], on_one[i], d);
  }
  const bool match = finite && worst <= 1e-5 && on_one.back() < on_one.front();
  std::printf(
      "   own block: the two runs %s (largest relative difference %.1e, bound 1e-5; loss %.3f -> "
      "%.3f)\n",
      match ? "match" : "DO NOT MATCH", worst, on_one.front(), on_one.back());
  return match;
}

} // namespace

int main(int argc, char** argv) try {
  std::string path = "weft_train_llama.safetensors";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--weights" && i + 1 < argc) {
      path = argv[++i];
    } else {
      std::fprintf(a == "--help" || a == "-h" ? stdout : stderr, "usage: %s [--weights FILE]\n",
                   argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const bool loaded = llama_from_one_rank_to_3d(path);
  const bool own_ok = own_block_at_2x2x1();
  return loaded && own_ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_train_llama: %s\n", e.what());
  return 1;
}
