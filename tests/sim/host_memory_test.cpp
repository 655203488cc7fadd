// The host trainer's memory (sim/host.hpp) against numbers worked out here by hand, tensor by
// tensor, for GPT and Llama layouts (ZeRO 0 to 3, buckets closed at unit boundaries, 1F1B, GPipe
// and an interleaved schedule over an uneven layout, tensor and sequence parallelism, the three
// recompute policies); its per-part parameters and stash bytes against the real layers, built on
// local ranks, whose parameters() and stash() are counted here; and the errors it names.
#include <weft/core/error.hpp>
#include <weft/sim/host.hpp>

// The layers' headers name the CBLAS policy; their GEMM here is reference_gemm (no BLAS).
#if __has_include(<cblas.h>)
#include <weft/comm/transport/local.hpp>
#include <weft/layer/gemm.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/llama.hpp>
#endif

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace sim = weft::sim;
using sim::host_family;
using sim::host_layout;
using sim::host_memory;
using sim::host_model;
using sim::recompute;
using kind = weft::pipeline::schedule_kind;

void expect_memory(const host_memory& got, const host_memory& want, const std::string& where) {
  EXPECT_EQ(got.weights, want.weights) << where;
  EXPECT_EQ(got.gathered_weights, want.gathered_weights) << where;
  EXPECT_EQ(got.gradients, want.gradients) << where;
  EXPECT_EQ(got.gradient_buckets, want.gradient_buckets) << where;
  EXPECT_EQ(got.optimizer_state, want.optimizer_state) << where;
  EXPECT_EQ(got.master_weights, want.master_weights) << where;
  EXPECT_EQ(got.activations, want.activations) << where;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// GPT, vocab 64, hidden 16, 4 heads (d 4), seq 8, 4 layers, FFN 64.
const host_model small_gpt{
    .family = host_family::gpt, .vocab = 64, .hidden = 16, .heads = 4, .seq = 8, .layers = 4};

// Its parts at tp 1, by hand: a block 12 h^2 + 13 h = 3,072 + 208 = 3,280 (SC21's count: QKV 3h^2 +
// 3h, output h^2 + h, MLP 8h^2 + 5h, two LayerNorms 4h); the embedding 64 x 16 + 8 x 16 (tokens,
// positions) = 1,152; the head 2 x 16 + 64 x 16 (LayerNorm, output layer) = 1,056.
TEST(host_memory, gpt_parts_are_sc21s_counts) {
  const auto p = sim::host_parameters_of(small_gpt, 1, 0);
  EXPECT_EQ(p.block, 3280u);
  EXPECT_EQ(p.embedding, 1152u);
  EXPECT_EQ(p.head, 1056u);
}

// tp 1, pp 1, dp 1, 1F1B, 2 microbatches of 2 sequences (T = 16 tokens), ZeRO 0, AdamW.
TEST(host_memory, gpt_on_one_rank) {
  const host_layout l{.micro_batch = 2, .global_batch = 4};
  // One bucket (4e7 elements by default) of 1,152 + 4 x 3,280 + 1,056 = 15,328, nothing padded.
  //   weights, gradients    15,328 x 4 = 61,312
  //   AdamW state           2 slots of 15,328 (a multiple of 16) + 2,064 = 17,392: 139,136
  // One block's stash, T = 16:
  //   ln1, ln2              2 x (16 x 16 + 16) doubles = 4,352
  //   attention             input 16 x 16, q k v 16 x 48, output's input (the context) 16 x 16:
  //                         (256 + 768 + 256) x 4 = 5,120; probabilities 2 x 4 x 8 x 8 x 4 = 2,048
  //   MLP                   input 16 x 16, fc1's output 16 x 64, fc2's input 16 x 64: 9,216
  //   block                 4,352 + 7,168 + 9,216 = 20,736
  // 1F1B on one stage holds one microbatch: 4 blocks and its 16 token ids, 82,944 + 64 = 83,008.
  expect_memory(
      sim::host_memory_of(small_gpt, l, 0, 0),
      {.weights = 61312, .gradients = 61312, .optimizer_state = 139136, .activations = 83008},
      "gpt");
}

// Llama, vocab 100, hidden 32, 4 heads of 8, 2 kv heads, FFN by Llama's rule (2/3 of 128 is 85,
// rounded up to 256), seq 8, 4 layers, on tp 2 pp 2 dp 2; 1F1B, 4 microbatches of 1 sequence;
// ZeRO 1, buckets of at least 5,000 elements.
TEST(host_memory, llama_closes_buckets_at_unit_boundaries) {
  const host_model m{.family = host_family::llama,
                     .vocab = 100,
                     .hidden = 32,
                     .heads = 4,
                     .kv_heads = 2,
                     .seq = 8,
                     .layers = 4};
  EXPECT_EQ(m.ffn_size(), 256u);
  const host_layout l{.tp = 2,
                      .pp = 2,
                      .dp = 2,
                      .micro_batch = 1,
                      .global_batch = 8,
                      .zero = 1,
                      .bucket_elements = 5000};
  // Per TP rank: 2 query heads and 1 kv head, q k v (2 + 2 x 1) x 8 = 32 rows of 32 = 1,024; the
  // output projection 32 x 16 = 512; the norms 2 x 32; gate, up, down 3 x 32 x 128 = 12,288: a
  // block 13,888. The embedding 50 x 32 = 1,600; the head 32 + 50 x 32 = 1,632.
  const auto p = sim::host_parameters_of(m, 2, 1);
  EXPECT_EQ(p.block, 13888u);
  EXPECT_EQ(p.embedding, 1600u);
  EXPECT_EQ(p.head, 1632u);
  // Block stash, T = R = 8: norms 2 x (8 x 32 + 8) doubles = 4,224; attention input 8 x 32, q k v
  // 8 x 32, the output's input (the context) 8 x 16, probabilities 1 x 2 x 8 x 8:
  // (256 + 256 + 128 + 128) x 4 = 3,072; MLP input 8 x 32, gate, up and down's input 3 x 8 x 128:
  // (256 + 3,072) x 4 = 13,312. A block 20,608.
  // pp 0: units 1,600 | 13,888 | 13,888: buckets 15,488 (1,600 is short of 5,000) and 13,888, both
  // even: 29,376, shard 14,688. AdamW: 2 x (14,688 + 2,064) x 4 = 134,016. 1F1B's first stage holds
  // 2 microbatches of 2 blocks and 8 ids: 2 x (41,216 + 32) = 82,496.
  expect_memory(
      sim::host_memory_of(m, l, 0, 0),
      {.weights = 117504, .gradients = 117504, .optimizer_state = 134016, .activations = 82496},
      "pp 0");
  // pp 1: the head's 1,632 is short, + 13,888 = 15,520 | 13,888: 29,408, shard 14,704;
  // AdamW 2 x (14,704 + 2,064) x 4 = 134,144; the last stage holds one microbatch, 41,216.
  expect_memory(
      sim::host_memory_of(m, l, 1, 1),
      {.weights = 117632, .gradients = 117632, .optimizer_state = 134144, .activations = 41216},
      "pp 1");
}

// ZeRO 3 on dp 3: one bucket per unit by default, each padded to a multiple of 3; GPipe holds
// every microbatch.
TEST(host_memory, zero3_shards_weights_and_gathers_buckets) {
  host_layout l{.dp = 3, .schedule = kind::gpipe, .micro_batch = 1, .global_batch = 6, .zero = 3};
  // Buckets (embedding, head, blocks) 1,152 | 1,056 | 3,282 (3,280 padded) x 4: 15,336, shard
  // 5,112.
  //   weights, gradients    the shard: 20,448
  //   gathered              this and the prefetched bucket, the two largest: 2 x 3,282 x 4 = 26,256
  //   gradient buckets      all of them, full size: 61,344
  //   AdamW                 2 x (5,120 + 2,064) x 4 = 57,472
  // Block stash, T = 8: norms 2 x 136 x 8 = 2,176; attention (128 + 384 + 128) x 4 + 4 x 64 x 4 =
  // 3,584; MLP (128 + 2 x 512) x 4 = 4,608; 10,368. GPipe holds both microbatches:
  // 2 x (4 x 10,368 + 32).
  expect_memory(sim::host_memory_of(small_gpt, l, 0, 0),
                {.weights = 20448,
                 .gathered_weights = 26256,
                 .gradients = 20448,
                 .gradient_buckets = 61344,
                 .optimizer_state = 57472,
                 .activations = 83008},
                "zero 3");
  l.prefetch = 0;
  EXPECT_EQ(sim::host_memory_of(small_gpt, l, 0, 0).gathered_weights, 3282u * 4);
  // Buckets of at least 5,000, the units in the optimizer's order (embedding, head, blocks):
  // 1,152 + 1,056 = 2,208 is short, + 3,280 = 5,488 -> 5,490; 3,280 + 3,280 = 6,560 -> 6,561; the
  // last block's 3,280 -> 3,282. 15,333 in all, a shard of 5,111; the two largest gathered.
  l.prefetch = 1;
  l.bucket_elements = 5000;
  const host_memory z = sim::host_memory_of(small_gpt, l, 0, 0);
  EXPECT_EQ(z.gathered_weights, (6561u + 5490u) * 4);
  EXPECT_EQ(z.gradient_buckets, 15333u * 4);
  EXPECT_EQ(z.weights, 5111u * 4);
  // ZeRO 2 keeps the weights whole; ZeRO 1 the gradients too, and has no bucket to gather or fill.
  l.zero = 2;
  const host_memory z2 = sim::host_memory_of(small_gpt, l, 0, 0);
  EXPECT_EQ(z2.weights, 15333u * 4);
  EXPECT_EQ(z2.gradients, 5111u * 4);
  EXPECT_EQ(z2.gathered_weights, 0u);
  EXPECT_EQ(z2.gradient_buckets, 15333u * 4);
  l.zero = 1;
  const host_memory z1 = sim::host_memory_of(small_gpt, l, 0, 0);
  EXPECT_EQ(z1.gradients, 15333u * 4);
  EXPECT_EQ(z1.gradient_buckets, 0u);
}

// GPT on tp 2, 2 sequences a microbatch (T = 16): 2 heads (a d = 8), q k v 24 columns, FFN 32 a
// rank.
TEST(host_memory, gpt_stash_under_tp_sp_and_recompute) {
  host_layout l{.tp = 2, .micro_batch = 2, .global_batch = 2};
  // Without SP: norms 2 x (16 x 16 + 16) x 8 = 4,352; attention input 16 x 16, q k v 16 x 24, the
  // output's input (the context) 16 x 8, probabilities 2 x 2 x 64: (256 + 384 + 128 + 256) x 4 =
  // 4,096; MLP input 16 x 16 and 2 x 16 x 32: 5,120. 13,568.
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 0).block, 13568u);
  // SP leaves 8 rows a rank: the norms 2 x (8 x 16 + 8) x 8 = 2,176; the column-parallel layers
  // keep their gathered input, 16 rows. 2,176 + 4,096 + 5,120 = 11,392.
  l.sequence_parallel = true;
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 1).block, 11392u);
  // Selective recompute drops the probabilities, 2 x 2 x 8 x 8 x 4 = 1,024.
  l.recomputation = recompute::selective;
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 1).block, 10368u);
  // Full recompute keeps the block's input: 8 rows of 16.
  l.recomputation = recompute::full;
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 1).block, 512u);
  l.sequence_parallel = false;
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 0).block, 1024u);
  // The token ids are every token's, with or without SP.
  EXPECT_EQ(sim::host_stash_of(small_gpt, l, 0).embedding, 16u * 4);
}

// Tied or not, the head holds an output weight of its own: the same bytes.
TEST(host_memory, a_tied_head_keeps_its_own_copy) {
  host_model tied = small_gpt;
  tied.tied = true;
  const host_layout l{.micro_batch = 2, .global_batch = 4};
  EXPECT_EQ(sim::host_memory_of(tied, l, 0, 0).total(),
            sim::host_memory_of(small_gpt, l, 0, 0).total());
  EXPECT_EQ(sim::host_memory_of(tied, l, 0, 0).weights, 61312u);
}

// Interleaved, pp 2, V 2, small_gpt with 8 layers as 3 | 1 | 1 | 3 blocks per virtual stage, 4
// microbatches of 1 sequence.
// The compute orders (generators.hpp's header):
//   rank 0  F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0
//   rank 1  F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0
// Rank 0's chunk 0 is 3 blocks and the ids (c0), its chunk 1 one block (c1): after F3.0 it holds
// 4 c0 + c1, more than the 3 c0 + 2 c1 after F2.0 though both are 5 pairs. Rank 1's chunk 0 is one
// block (d0), its chunk 1 three (d1): 2 d0 + d1 after F0.1 beats 3 d0 after F2.0.
TEST(host_memory, interleaved_peak_weighs_each_chunk) {
  const host_layout l{.pp = 2,
                      .chunks = 2,
                      .schedule = kind::interleaved,
                      .micro_batch = 1,
                      .global_batch = 4,
                      .blocks_per_stage = {3, 1, 1, 3}};
  host_model m = small_gpt;
  m.layers = 8;
  const std::size_t block = 10368,
                    ids = 8 * 4; // T = 8, as in zero3_shards_weights_and_gathers_buckets
  const std::size_t c0 = 3 * block + ids, c1 = block;
  const host_memory r0 = sim::host_memory_of(m, l, 0, 0);
  EXPECT_EQ(r0.activations, 4 * c0 + c1);
  EXPECT_EQ(r0.weights, (1152u + 4 * 3280u) * 4); // the embedding and 3 + 1 blocks
  const host_memory r1 = sim::host_memory_of(m, l, 1, 0);
  EXPECT_EQ(r1.activations, 2 * block + 3 * block);
  EXPECT_EQ(r1.weights, (4 * 3280u + 1056u) * 4); // 1 + 3 blocks and the head
}

// SGD keeps no state, with momentum one slot.
TEST(host_memory, optimizer_slots) {
  host_layout l{.micro_batch = 2, .global_batch = 4, .slots = 0};
  EXPECT_EQ(sim::host_memory_of(small_gpt, l, 0, 0).optimizer_state, 0u);
  l.slots = 1;
  EXPECT_EQ(sim::host_memory_of(small_gpt, l, 0, 0).optimizer_state, (15328u + 2064u) * 4);
}

TEST(host_memory, names_what_the_trainer_refuses) {
  const host_layout ok{.micro_batch = 2, .global_batch = 4};
  const auto with = [&](auto change) {
    host_model m = small_gpt;
    host_layout l = ok;
    change(m, l);
    return [m, l] { (void)sim::host_memory_of(m, l, 0, 0); };
  };
  expect_error(with([](host_model&, host_layout& l) { l.tp = 3; }),
               "4 heads do not divide over a tensor-parallel group of 3");
  expect_error(with([](host_model& m, host_layout&) { m.kv_heads = 2; }),
               "kv_heads 2 applies to llama");
  expect_error(with([](host_model& m, host_layout& l) {
                 m.family = host_family::llama;
                 m.hidden = 48;
                 m.heads = 12;
                 m.kv_heads = 4;
                 l.tp = 6;
               }),
               "4 key/value heads and a tensor-parallel group of 6: neither divides the other");
  expect_error(with([](host_model& m, host_layout&) {
                 m.family = host_family::llama;
                 m.hidden = 12; // head dimension 3
               }),
               "head dimension 3 is odd");
  expect_error(with([](host_model& m, host_layout& l) {
                 m.layers = 5;
                 l.pp = 2;
               }),
               "5 layers do not split evenly over 2 virtual stages");
  expect_error(with([](host_model&, host_layout& l) {
                 l.pp = 2;
                 l.blocks_per_stage = {3, 2};
               }),
               "the stages hold 5 layers, the model has 4");
  expect_error(with([](host_model&, host_layout& l) { l.global_batch = 5; }),
               "a global batch of 5 sequences does not split into 1 data-parallel ranks x "
               "microbatches of 2");
  expect_error(with([](host_model&, host_layout& l) { l.sequence_parallel = true; }), "tp is 1");
  expect_error(with([](host_model& m, host_layout& l) {
                 m.seq = 9;
                 l.tp = 2;
                 l.micro_batch = 1;
                 l.global_batch = 1;
                 l.sequence_parallel = true;
               }),
               "a microbatch of 9 tokens does not split over 2 ranks");
  expect_error(with([](host_model&, host_layout& l) { l.schedule = kind::zero_bubble_h1; }),
               "does not run zb-h1");
  expect_error(with([](host_model&, host_layout& l) { l.zero = 4; }),
               "ZeRO stage must be 0, 1, 2 or 3, not 4");
  expect_error(
      [] { (void)sim::host_memory_of(small_gpt, host_layout{.pp = 2, .global_batch = 2}, 2, 0); },
      "no rank (pp 2, tp 0) in a mesh of pp 2 x tp 1");
  expect_error([] { (void)sim::model_family_named("bert"); },
               "unknown model family 'bert': expected gpt or llama");
}

#if __has_include(<cblas.h>)

using comm_t = weft::local::communicator;
using gemm_t = weft::layer::reference_gemm;
namespace recompute_policy = weft::layer::recompute;

template <class T, class S>
std::size_t bytes(const weft::matrix<T, S>& m) {
  return m.size() * sizeof(T);
}

// One block's stash, every matrix of it: the norms', the attention's, the MLP's, the block's input.
template <class A>
std::size_t stash_bytes(const A& s) {
  const auto norm = [](const auto& n) { return bytes(n.xhat) + bytes(n.rstd); };
  std::size_t sum = norm(s.ln1) + norm(s.ln2) + bytes(s.input);
  sum += bytes(s.attn.qkv.x) + bytes(s.attn.out.x) + bytes(s.attn.qkv_out) + bytes(s.attn.probs);
  if constexpr (requires { s.mlp.fc1; }) { // GELU MLP
    sum += bytes(s.mlp.fc1.x) + bytes(s.mlp.fc2.x) + bytes(s.mlp.h);
  } else { // SwiGLU
    sum += bytes(s.mlp.x) + bytes(s.mlp.g) + bytes(s.mlp.u) + bytes(s.mlp.down.x);
  }
  return sum;
}

template <class Part>
std::size_t elements(Part& part) {
  std::size_t n = 0;
  for (const auto& p : part.parameters())
    n += p.value.size();
  return n;
}

sim::recompute sim_policy(recompute_policy::none) { return recompute::none; }
sim::recompute sim_policy(recompute_policy::selective) { return recompute::selective; }
sim::recompute sim_policy(recompute_policy::full) { return recompute::full; }

// Builds the model's embedding, one block and the head on `tp` local ranks, runs the embedding and
// the block forward on a microbatch of 2 sequences, and sets the parts' parameters and stashes, as
// the layers report them, beside the simulator's.
template <class Model, class SP, class Recompute>
void compare_with_layers(const typename Model::config& c, const host_model& m, int tp) {
  using parts = typename Model::template parts<float, comm_t, gemm_t, SP, Recompute>;
  const host_layout l{.tp = tp,
                      .micro_batch = 2,
                      .global_batch = 2,
                      .recomputation = sim_policy(Recompute{}),
                      .sequence_parallel = SP::enabled};
  const std::string where = std::string(sim::name_of(m.family)) + " tp " + std::to_string(tp) +
                            (SP::enabled ? " SP" : "") + " recompute " +
                            std::string(sim::name_of(l.recomputation));
  const std::size_t tokens = 2 * c.seq,
                    rows = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
  weft::local::run(tp, [&](comm_t& comm) {
    typename parts::embedding embedding(comm, c, 7, gemm_t{});
    typename parts::block block(comm, c, 0, 7, gemm_t{});
    typename parts::head head(comm, c, 7, gemm_t{});
    const auto want = sim::host_parameters_of(m, tp, comm.rank());
    EXPECT_EQ(elements(embedding), want.embedding) << where;
    EXPECT_EQ(elements(block), want.block) << where;
    EXPECT_EQ(elements(head), want.head) << where;

    std::vector<std::int32_t> ids(tokens);
    for (std::size_t i = 0; i < tokens; ++i)
      ids[i] = static_cast<std::int32_t>(i * 7 % c.vocab);
    weft::matrix<float> x(rows, c.hidden), y(rows, c.hidden);
    embedding.forward(ids, x.view());
    block.forward(weft::layer::detail::cview(x.view()), y.view());
    const auto stash = sim::host_stash_of(m, l, comm.rank());
    const auto e = embedding.stash();
    if constexpr (requires { e.tokens; }) {
      EXPECT_EQ(e.tokens.ids.size() * sizeof(std::int32_t), stash.embedding) << where;
    } else {
      EXPECT_EQ(e.ids.size() * sizeof(std::int32_t), stash.embedding) << where;
    }
    EXPECT_EQ(stash_bytes(block.stash()), stash.block) << where << ", rank " << comm.rank();
  });
}

template <class Model>
void every_policy(const typename Model::config& c, const host_model& m, int tp) {
  using weft::layer::no_sequence_parallel;
  using weft::layer::sequence_parallel;
  compare_with_layers<Model, no_sequence_parallel, recompute_policy::none>(c, m, tp);
  compare_with_layers<Model, no_sequence_parallel, recompute_policy::selective>(c, m, tp);
  compare_with_layers<Model, no_sequence_parallel, recompute_policy::full>(c, m, tp);
  if (tp > 1) {
    compare_with_layers<Model, sequence_parallel, recompute_policy::none>(c, m, tp);
    compare_with_layers<Model, sequence_parallel, recompute_policy::selective>(c, m, tp);
    compare_with_layers<Model, sequence_parallel, recompute_policy::full>(c, m, tp);
  }
}

// GPT with a vocabulary that splits unevenly over 2 ranks (65: 33 and 32 rows), and its FFN of
// 4 h = 64 or of 31 (16 and 15 columns).
TEST(host_memory, gpt_parts_match_the_layers) {
  for (std::size_t ffn : {std::size_t{0}, std::size_t{31}}) {
    const weft::layer::gpt_config c{
        .vocab = 65, .hidden = 16, .heads = 4, .ffn = ffn, .seq = 8, .layers = 2};
    const host_model m{.family = host_family::gpt,
                       .vocab = 65,
                       .hidden = 16,
                       .heads = 4,
                       .ffn = ffn,
                       .seq = 8,
                       .layers = 2};
    every_policy<weft::layer::gpt_model>(c, m, 1);
    every_policy<weft::layer::gpt_model>(c, m, 2);
  }
}

// Llama: multi-head (the fused layout), kv heads split over TP, and kv heads replicated (2 over 4
// ranks, 1 over 2 and 4); vocabulary 37 and FFN 22 split unevenly.
TEST(host_memory, llama_parts_match_the_layers) {
  for (std::size_t kv : {std::size_t{0}, std::size_t{2}, std::size_t{1}}) {
    const weft::layer::llama_config c{
        .vocab = 37, .hidden = 16, .heads = 4, .kv_heads = kv, .ffn = 22, .seq = 8, .layers = 2};
    const host_model m{.family = host_family::llama,
                       .vocab = 37,
                       .hidden = 16,
                       .heads = 4,
                       .kv_heads = kv,
                       .ffn = 22,
                       .seq = 8,
                       .layers = 2};
    every_policy<weft::layer::llama_model>(c, m, 1);
    every_policy<weft::layer::llama_model>(c, m, 2);
    every_policy<weft::layer::llama_model>(c, m, 4);
  }
  // Llama's FFN rule, as its config applies it.
  for (std::size_t h : {std::size_t{16}, std::size_t{4096}, std::size_t{8192}}) {
    const weft::layer::llama_config c{.hidden = h};
    EXPECT_EQ((host_model{.family = host_family::llama, .hidden = h}.ffn_size()), c.ffn_size())
        << h;
  }
}

#else

TEST(host_memory, parts_match_the_layers) {
  GTEST_SKIP() << "no cblas.h: the layers' headers need it";
}

#endif

} // namespace
