#pragma once
// The simulator's calibration: every fitted constant, one set per GPU type, in this one file.
// Nothing is tuned per run: the rows marked `tune` in data/published_runs.csv and
// data/sharded_runs.csv fixed these figures, and tests/sim/step_test.cpp (sim_step_test) and
// tests/sim/sharded_runs_test.cpp (sim_sharded_runs_test) check every row, held-out rows too,
// against them.
//
//   GEMM time      2 m n k / (peak * e(m, n, k)),  e = gemm_peak_fraction * q(m) q(n) q(k),
//                  q(d) = d / (d + gemm_half_dim): a GEMM with a small side fills the tensor
//                  cores poorly (tiles half empty, too few thread blocks, wave quantization),
//                  a large one reaches gemm_peak_fraction. Never faster than its operands
//                  cross HBM.
//   elementwise    bytes / (hbm_bandwidth * hbm_fraction): layer norms, dropout, residual
//                  adds, GeLU, softmax (the byte counts are in layer_cost.hpp; they are counted,
//                  not fitted).
//   links          the cost model runs on the node's links with their bandwidth scaled by
//                  nvlink_fraction and ib_fraction: the share of the wire a collective library
//                  reaches (nccl-tests on DGX A100 report all-reduce bus bandwidths near
//                  230 GB/s of NVLink3's 300 GB/s, and near 23 GB/s of HDR's 25 GB/s per NIC).
//   per layer      kernel launches and synchronisation of one layer's forward or backward pass.
//   overlap        while a ZeRO-3 gather or reduce-scatter runs on its stream beside the compute,
//                  the compute takes 1 + overlap_slowdown times as long (sharded.hpp): NCCL's
//                  kernels hold SMs (an all-gather's 24 thread blocks on an H100's 132 SMs, as
//                  Nsight shows in NVIDIA's developer forum, "Compute-Communication Overlap Causes
//                  Severe GEMM Performance Degradation because of Tail Effect") and HBM
//                  bandwidth, and a GEMM sized for every SM runs a second, mostly idle wave.
//                  Not applied to the DP bucket overlap, the distributed optimizer's overlapped
//                  gathers or tp_comm_overlap: the constants were fitted on the rows that use
//                  those with the overlap as it stands.
//   FP8 GEMMs      the same form on the FP8 peak, with fp8_gemm_peak_fraction for
//                  gemm_peak_fraction (layer_cost.hpp: which GEMMs, and their casts).
//
// The fit (tests/sim/fit_calibration.cpp, sim_fit_calibration; data/README.md, "The fit"): per
// GPU type, one grid over gemm_peak_fraction (0.55..0.85 by 0.01), gemm_half_dim (20 values
// from 1 to 1,024), hbm_fraction (0.60..0.90 by 0.05) and overlap_slowdown (0..1.5 by 0.01),
// the point with the smallest largest error of the type's bf16 tuning rows in both files; then,
// at that point, fp8_gemm_peak_fraction (0.30..0.90 by 0.01) on its FP8 tuning rows. The link
// shares and the H100's per-layer overhead are set by hand.
//   A100  8 rows: SC21's 1.7B, 18.4B, 145.6B and 1T and MT-NLG (Megatron-LM and DeepSpeed 3D
//         layouts, hidden 2,304 to 25,600, full recompute) and llm-foundry's MPT 760M, 13B and
//         70B under FSDP on A100 40GB (hidden 1,536 to 8,192; none and full recompute).
//         Largest error 5.2% (MPT 13B -5.2%, SC21 18.4B -5.1%, MT-NLG +4.8%). overlap_slowdown
//         comes out 0: any slowdown takes MPT 13B, which reads low, lower.
//   H100  4 rows: Llama 3 405B on 8,192 GPUs (hidden 16,384, no recompute) and llm-foundry's
//         MPT 760M, 13B (none) and 70B (full) under FSDP. Largest error 0.6%. FP8, 1 row: NeMo
//         24.07's Llama 2 7B on 8 GPUs, -9.2% at fp8_gemm_peak_fraction 0.90, the grid's edge:
//         the rest of its step (the bf16 attention core above all, priced as batched GEMMs with
//         a side of head size and no causal saving) is priced longer than the run took, and the
//         fraction makes up what it can. Held out, NeMo's GPT-3 175B reads +13 to +14% at 0.90.
// The figures rest on the model as it stands: a collective charged one latency per round rather
// than per chunk, an unfused gradient accumulation charged (layout::grad_accumulation_bytes),
// and MT-NLG's rows at two sequences per micro-batch, which its three published scales imply.
//
// The A100 40GB takes the 80GB's constants (the same die and clocks); the H200 takes the
// H100's (the same compute die). No H200 row tunes them; KempnerForge's held-out H200 runs
// (data/README.md) read faster than they price its compute: its 7B without TP 25-30%.
#include <weft/core/error.hpp>
#include <weft/sim/hardware.hpp>

#include <string>
#include <string_view>

namespace weft::sim {

struct calibration {
  std::string_view gpu;            // the preset's name
  double gemm_peak_fraction = 0.8; // the most of peak FLOP/s a large GEMM reaches
  double gemm_half_dim = 64;       // the GEMM side at which q(d) is one half
  double hbm_fraction = 0.8;       // achieved share of HBM bandwidth of elementwise kernels
  double nvlink_fraction = 0.77;   // achieved share of the NVLink bandwidth of collectives
  double ib_fraction = 0.9;        // achieved share of the InfiniBand bandwidth
  double layer_overhead_s = 0;     // fixed cost of one layer pass (launches, syncs)
  double overlap_slowdown = 0;     // compute's extra time while a ZeRO-3 collective runs beside it
  double fp8_gemm_peak_fraction = 0; // the most of the FP8 peak a large FP8 GEMM reaches; 0: no
                                     // FP8 tensor cores
};

/// `c` for another GPU preset that takes the same constants.
[[nodiscard]] constexpr calibration renamed(calibration c, std::string_view gpu) noexcept {
  c.gpu = gpu;
  return c;
}

inline constexpr calibration a100_calibration{"a100-80gb", 0.73, 64, 0.75, 0.77, 0.90, 0, 0, 0};
inline constexpr calibration a100_40gb_calibration = renamed(a100_calibration, "a100-40gb");
inline constexpr calibration h100_calibration{"h100-sxm", 0.74,  256,  0.80, 0.77,
                                              0.90,       20e-6, 0.34, 0.90};
inline constexpr calibration h200_calibration = renamed(h100_calibration, "h200");

/// The constants of GPU `g`.
[[nodiscard]] inline calibration calibration_of(const gpu& g) {
  for (const calibration& c :
       {a100_calibration, a100_40gb_calibration, h100_calibration, h200_calibration})
    if (c.gpu == g.name) return c;
  throw error("weft: sim: no calibration for GPU '" + std::string(g.name) + "'");
}

} // namespace weft::sim
