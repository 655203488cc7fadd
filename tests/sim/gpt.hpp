#pragma once
// A GPT-style model (learned positions, tied embedding, 4h FFN) and a Llama-style one from their
// shapes, and Nemotron-4 340B with its DGX Cloud recipe's layout, for the simulator's tests.
#include <weft/sim/layout.hpp>
#include <weft/sim/model.hpp>

#include <string>
#include <utility>

namespace weft_test {

inline weft::sim::model_spec gpt(std::string name, int layers, int hidden, int heads,
                                 int vocab = 51200, int seq = 2048) {
  weft::sim::model_spec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq = seq;
  m.vocab = vocab;
  return m;
}

/// A Llama-style model from its shape: rotary positions, a SwiGLU MLP of width `ffn` (0: 4 h),
/// `kv_heads` key-value heads (0: one per head), an output layer of its own, no dropout, fused
/// attention.
inline weft::sim::model_spec llama(std::string name, int layers, int hidden, int heads,
                                   int kv_heads, int ffn, int vocab = 32000, int seq = 4096) {
  weft::sim::model_spec m = gpt(std::move(name), layers, hidden, heads, vocab, seq);
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.gated = true;
  m.learned_positions = false;
  m.tied_embeddings = false;
  m.dropout = false;
  m.flash_attention = true;
  return m;
}

/// Nemotron-4 340B (no dropout, no biases, as NeMo's NemotronConfig trains it).
inline weft::sim::model_spec nemotron_340b() {
  weft::sim::model_spec m = gpt("nemotron4-340b", 96, 18432, 96, 256000, 4096);
  m.kv_heads = 8;
  m.ffn = 73728;
  m.flash_attention = true;
  m.learned_positions = false;
  m.tied_embeddings = false;
  m.dropout = false;
  return m;
}

/// Nemotron-4 340B's DGX Cloud recipe (dgxc-benchmarking's nemotron4-340b-synth.yaml and
/// configure.sh: NeMo 24.09, TP 8, PP 8, 12 virtual stages, sequence parallelism, micro-batch 1,
/// 32 sequences on 128 H100, so DP 2 and 16 micro-batches), under Megatron-core's ZeRO-1.
inline weft::sim::layout nemotron_recipe() {
  weft::sim::layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 2;
  l.global_batch = 32;
  l.schedule = weft::pipeline::schedule_kind::interleaved;
  l.chunks = 12;
  l.sequence_parallel = true;
  l.zero = 1;
  return l;
}

} // namespace weft_test
