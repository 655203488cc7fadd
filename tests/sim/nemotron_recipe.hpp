#pragma once
// Nemotron-4 340B's DGX Cloud recipe's layout, for the simulator's tests (the model is
// sim::model_named("nemotron4-340b")).
#include <weft/sim/layout.hpp>
#include <weft/sim/model.hpp>

namespace weft_test {

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
