#pragma once
// Sharded data parallelism (ZeRO-3, PyTorch FSDP/FSDP2, HSDP) as it runs: one pass (a
// micro-batch's forward or backward) over a rank's blocks, each block's all-gather on a
// communication stream beside the compute, and the engine presets that set a layout's sharding.
//
//   a pass     blocks in order; block i computes once its gather has ended and block i - 1's
//              compute has; the communication stream runs its collectives one at a time in the
//              order they are issued: block i's gather when block i - prefetch's compute starts
//              (prefetch 0: when block i - 1's ends, ahead of block i - 1's trailing
//              collective, as FSDP1's BACKWARD_POST issues it), block i's trailing collective (the
//              backward's reduce-scatter) when its compute ends. What a gather needs beyond the
//              compute it runs behind shows; the first block's gather, and the last block's
//              reduce-scatter, nothing hides. While the stream runs a collective, the compute
//              beside it runs `slowdown` longer (1 + slowdown times its own time): the
//              collective's kernels hold SMs and HBM bandwidth the GEMMs would use.
//   engines    use_shard_engine: "deepspeed-zero3", "fsdp" (FSDP1 FULL_SHARD), "fsdp2"
//              (fully_shard), "megatron-distopt" (ZeRO-1); HSDP is FSDP with layout::shard_group
//              set. The engines themselves are layout.hpp's shard_engine.
#include <weft/core/error.hpp>
#include <weft/sim/layout.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace weft::sim {

/// One block of a pass: its compute, the all-gather of its weights before it (0: already
/// whole) and the collective issued after it (its gradient's reduce-scatter; 0: none).
struct shard_block {
  double compute_s = 0;
  double gather_s = 0;
  double after_s = 0;
};

/// A pass's time, from its first gather's start to the end of its last compute and
/// collective, and the part of it no compute covers.
struct shard_pass {
  double time_s = 0;
  double exposed_s = 0; // time_s less the blocks' compute
};

/// Runs `blocks` in order with gathers up to `prefetch` blocks ahead, the compute slowed by
/// `slowdown` while a collective runs beside it (see the header).
[[nodiscard]] inline shard_pass run_sharded_pass(const std::vector<shard_block>& blocks,
                                                 int prefetch, double slowdown = 0) {
  if (prefetch < 0)
    throw error("weft: sim: sharded pass: prefetch must be at least 0, not " +
                std::to_string(prefetch));
  if (!(slowdown >= 0))
    throw error("weft: sim: sharded pass: slowdown must be at least 0, not " +
                std::to_string(slowdown));
  // A block's compute of `work` seconds starting at `start`: the stream is busy from there
  // until `comm` (what it runs was issued by then), and the compute runs 1 + slowdown times
  // slower while it is.
  const double slow = 1 + slowdown;
  const auto compute_time = [slow](double work, double start, double busy_until) {
    const double shared = std::max(0.0, busy_until - start);
    return work * slow <= shared ? work * slow : shared + (work - shared / slow);
  };
  const std::size_t n = blocks.size();
  const auto ahead = static_cast<std::size_t>(prefetch);
  std::vector<double> gathered(n, 0.0);
  double comm = 0, compute = 0, busy = 0;
  const auto gather = [&](std::size_t i, double issued) {
    comm = std::max(comm, issued) + blocks[i].gather_s;
    gathered[i] = comm;
  };
  // Issued before the pass's first compute: the first `prefetch` blocks' gathers, at least the
  // first block's.
  for (std::size_t i = 0; i < std::min(std::max<std::size_t>(ahead, 1), n); ++i)
    gather(i, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const double start = std::max(compute, gathered[i]);
    if (ahead > 0 && i + ahead < n) gather(i + ahead, start);
    compute = start + compute_time(blocks[i].compute_s, start, comm);
    busy += blocks[i].compute_s;
    if (ahead == 0 && i + 1 < n) gather(i + 1, compute); // before this block's collective
    if (blocks[i].after_s > 0) comm = std::max(comm, compute) + blocks[i].after_s;
  }
  const double time = std::max(compute, comm);
  return {time, std::max(0.0, time - busy)};
}

/// How each engine (layout.hpp's shard_engine) runs its stage:
///   deepspeed_zero3  DeepSpeed's stage 3: every micro-batch gathers each block for its forward
///                    and again for its backward and reduce-scatters its gradients (buckets of
///                    reduce_bucket_size, 5e8 elements by default, overlapped with the backward
///                    under overlap_comm); stage3_prefetch_bucket_size (5e7 parameters by
///                    default) prefetches about one block of a 1B-parameter model ahead, less of
///                    a larger one's: prefetch 1 (DeepSpeed's configuration reference,
///                    deepspeed.ai/docs/config-json, "ZeRO optimizations").
///   fsdp             PyTorch FSDP1, FULL_SHARD: each FSDP unit gathered before its forward and
///                    (reshard after forward) its backward; the forward's next gather is issued
///                    while the current unit computes, at most two in flight under
///                    limit_all_gathers (the default since PyTorch 2.1, pytorch/pytorch#104900),
///                    and BACKWARD_PRE (PyTorch's default) issues the backward's next gather
///                    before the current unit's gradient computation: prefetch 1 both ways
///                    (PyTorch docs, "FSDP Notes: FSDP Prefetch Nuances"). BACKWARD_POST
///                    issues it in the current unit's post-backward hook, after its gradient
///                    computation and before its reduce-scatter (_runtime_utils.py:
///                    _post_backward_reshard, then _reduce_grad): layout::backward_prefetch
///                    0. Every micro-batch gathers and reduce-scatters unless the loop runs
///                    under no_sync.
///   fsdp2            PyTorch FSDP2, fully_shard: reshard_after_forward true by default,
///                    implicit one-module-ahead prefetch in forward and explicit one ahead in
///                    backward (pytorch/pytorch#128884): prefetch 1.
///   megatron_distopt ZeRO-1: the gathering settings do not apply; overlap_param_gather is the
///                    layout's own choice (Megatron-LM's --overlap-param-gather).
/// The ZeRO-3 engines differ in where their defaults come from, not in the figures: each
/// regathers for the backward, prefetches one block and reduce-scatters every micro-batch.

/// HBM bytes per weight and micro-batch that `l`'s ZeRO-3 engine copies besides its collectives,
/// averaged over the step's micro-batches: l.shard_copy_bytes where set, else the engine's (0
/// without ZeRO-3, and on one DP rank, where the single-GPU runs of data/sharded_runs.csv show no
/// such cost). FSDP1's weights are views into its flat parameter, so every backward copies each
/// weight's 16-bit gradient into the flat gradient (4 bytes: 2 read, 2 written), and a
/// reduce-scatter in fp32 (grad_bytes 4) casts it first (6 more: 2 read, 4 written;
/// _runtime_utils.py's _reduce_grad). FSDP2's copies come with its collectives: each gather's
/// output into the weights (4 bytes), each reduce-scatter's input from the gradients (4, or 6 cast
/// to fp32). So a layout that gathers once a step (sync once), keeps the forward's
/// weights for the backward (reshard_after_forward false) or reduce-scatters on the step's last
/// micro-batch alone (sync last) copies that much less often. DeepSpeed's stage 3:
/// not counted.
[[nodiscard]] inline double shard_copy_bytes_of(const layout& l) noexcept {
  if (l.shard_copy_bytes) return *l.shard_copy_bytes;
  if (l.zero != 3 || l.grad_ranks() == 1) return 0;
  const shard_cadence k = l.cadence();
  const bool fp32_reduce = l.grad_bytes > 2;
  switch (l.sharding) {
    case shard_engine::fsdp: return 4.0 + (fp32_reduce ? 6.0 * k.reduces() : 0.0);
    case shard_engine::fsdp2: return 4.0 * k.gathers() + (fp32_reduce ? 6.0 : 4.0) * k.reduces();
    case shard_engine::none:
    case shard_engine::deepspeed_zero3:
    case shard_engine::megatron_distopt: return 0;
  }
  return 0;
}

/// Sets `l` to engine `e`'s ZeRO stage and, for ZeRO-3, its gathering; records `e` in
/// l.sharding (describe() names it). Keeps `l.shard_group` (HSDP).
inline void use_shard_engine(layout& l, shard_engine e) {
  l.sharding = e;
  if (e == shard_engine::none) return;
  l.zero = zero_stage_of(e);
  if (l.zero != 3) return;
  l.reshard_after_forward = true;
  l.sync = shard_sync::every;
  l.prefetch = 1;
  l.backward_prefetch = 1;
}

} // namespace weft::sim
