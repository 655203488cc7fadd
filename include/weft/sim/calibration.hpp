#pragma once
// The simulator's calibration: every fitted constant, one set per GPU type, in this one file.
// Nothing is tuned per run: the published runs of data/published_runs.csv marked `tune` fixed
// these figures (overlap_slowdown: those of data/sharded_runs.csv), and tests/sim/step_test.cpp
// (sim_step_test) and tests/sim/sharded_runs_test.cpp check every row (held-out rows too)
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
//                  Fitted per GPU type on the rows of data/sharded_runs.csv marked `tune`
//                  (tests/sim/sharded_runs_test.cpp reruns the fit): H100 0.55; A100 0, its
//                  tuning row reading low without it. Not applied to the DP bucket overlap, the
//                  distributed optimizer's overlapped gathers or tp_comm_overlap: the constants
//                  above were fitted on the rows that use those with the overlap as it stands.
//
// The A100 40GB takes the 80GB's constants (the same die and clocks; its rows in
// data/sharded_runs.csv are held out, none fitted). H200 has no published run here: it takes
// H100's constants (the same compute die); its predictions are uncalibrated.
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
};

// A100: fitted on the rows of data/published_runs.csv marked `tune` (a grid over the first
// three figures, gemm_peak_fraction 0.60..0.80 by 0.01, gemm_half_dim 14 values from 1 to 128,
// hbm_fraction 0.60..0.90 by 0.05, minimising the largest error: 2.3%;
// tests/sim/fit_calibration.cpp reruns it, see data/README.md). H100: gemm_peak_fraction
// fitted to its one tuning row (Llama 3 405B on 8,192 GPUs); the other figures set by hand.
// The A100 figures are the fit under the model as it stands: a collective charged one latency
// per round rather than per chunk, an unfused gradient accumulation charged
// (layout::grad_accumulation_bytes), and MT-NLG's rows at two sequences per micro-batch, which
// its three published scales imply. Without the accumulation charge the fit gives
// gemm_peak_fraction 0.61 and gemm_half_dim 16; with it but one sequence per MT-NLG
// micro-batch, 0.63 and 4, and a minimax of 6.5% between MT-NLG read high and SC21 read low.
inline constexpr calibration a100_calibration{"a100-80gb", 0.67, 4, 0.90, 0.77, 0.90, 0};
inline constexpr calibration a100_40gb_calibration{"a100-40gb", 0.67, 4, 0.90, 0.77, 0.90, 0};
inline constexpr calibration h100_calibration{"h100-sxm", 0.71, 200, 0.70, 0.77, 0.90, 20e-6, 0.55};
inline constexpr calibration h200_calibration{"h200", 0.71, 200, 0.70, 0.77, 0.90, 20e-6, 0.55};

/// The constants of GPU `g`.
[[nodiscard]] inline calibration calibration_of(const gpu& g) {
  for (const calibration& c :
       {a100_calibration, a100_40gb_calibration, h100_calibration, h200_calibration})
    if (c.gpu == g.name) return c;
  throw error("weft: sim: no calibration for GPU '" + std::string(g.name) + "'");
}

} // namespace weft::sim
