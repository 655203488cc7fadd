#pragma once
// Compute of one transformer layer on one GPU: GEMMs by calibration.hpp's efficiency model,
// the attention core, and the elementwise kernels at HBM speed.
//
// FP8 (layout.hpp's precision): the four Linears' GEMMs (QKV, attention output, MLP up and
// down) run on the FP8 peak at fp8_gemm_peak_fraction, with 1-byte operands; the attention core
// stays bf16, and so does the output layer but under torchao (step.hpp). Each FP8 operand is cast
// from bf16 first, at HBM speed, and counted, not fitted. Hopper's FP8 GEMMs take both operands
// K-major (the cuBLASLt "TN" layout), so of Y = X W^T, dX = dY W and dW = dY^T X each operand
// is needed in both layouts: a cast reads the bf16 tensor (2 bytes an element) and writes its
// FP8 copy and the copy's transpose (1 + 1), as Transformer Engine's fused cast-transpose does:
// 4 bytes. Scaling by the tensor's own amax (current scaling, torchao's dynamic scaling) reads
// it once more first: 6. Delayed scaling takes the amax of earlier steps and needs no such
// pass. Per micro-batch: the Linears' inputs in the forward (again under full recompute), the
// output gradients in the backward; the weights once a step under Transformer Engine (its FP8
// weights are kept from a step's first micro-batch), every forward under torchao.
#include <weft/core/error.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/layout.hpp>
#include <weft/sim/model.hpp>

#include <algorithm>
#include <string>

namespace weft::sim {

namespace detail {

/// Seconds of a GEMM m x n x k (times `batch` independent ones) on `g`: in bf16, or with
/// `p` an FP8 precision in FP8 (1-byte operands, a bf16 result).
inline double gemm_time(double m, double n, double k, double batch, const gpu& g,
                        const calibration& cal, precision p = precision::bf16) {
  const bool fp8 = p != precision::bf16;
  const double peak = fp8 ? g.fp8_flops : g.peak_flops;
  const double fraction = fp8 ? cal.fp8_gemm_peak_fraction : cal.gemm_peak_fraction;
  if (!(peak > 0) || !(fraction > 0))
    throw error("weft: sim: GPU '" + std::string(g.name) + "' has no " +
                std::string(fp8 ? "FP8" : "bf16") + " GEMM peak or calibration");
  const auto q = [&](double d) { return d / (d + cal.gemm_half_dim); };
  const double eff = fraction * q(m) * q(n) * q(k);
  const double compute = 2.0 * m * n * k * batch / (peak * eff);
  const double operand_bytes = fp8 ? 1.0 : 2.0;
  const double traffic = (operand_bytes * (m * k + k * n) + 2.0 * m * n) * batch /
                         (g.hbm_bandwidth * cal.hbm_fraction);
  return std::max(compute, traffic);
}

/// HBM bytes per element of casting a bf16 GEMM operand to FP8 under `p` (0 for bf16): read it,
/// write the FP8 copy and its transpose; under current or dynamic scaling read it once more for
/// its amax first.
[[nodiscard]] constexpr double cast_bytes(precision p) noexcept {
  switch (p) {
    case precision::bf16: return 0;
    case precision::fp8: return 4;
    case precision::fp8_cs:
    case precision::fp8_linear: return 6;
  }
  return 0;
}

} // namespace detail

/// Compute seconds of one layer's forward on one TP rank, for a micro-batch of b sequences,
/// without communication: the GEMMs, the attention core, and the elementwise kernels. Their
/// bytes per token, an estimate: 15h for the two layer norms (each reads and writes h 16-bit
/// values: 8h) and the two fused bias-dropout-residual adds (7h in all), replicated on every
/// TP rank unless sequence parallel; the activation function reads and writes f/t 16-bit
/// values (4f/t; 6f/t gated); the attention core's softmax and dropout read and write the
/// b a/t s^2 scores (9 bytes each: 2+2 softmax, 2+2 dropout, a 1-byte mask) unless fused.
/// Under an FP8 precision `p` the Linears' GEMMs run in FP8 and their operands' casts are priced
/// (above).
struct layer_cost {
  double gemm_s = 0;
  double attention_s = 0;
  double elementwise_s = 0;      // all of them, core_elementwise_s included
  double core_elementwise_s = 0; // the attention core's softmax and dropout (0 when fused)
  double qkv_gemm_s = 0;         // the column-parallel GEMMs, whose backward collectives
  double up_gemm_s = 0;          // Megatron-LM overlaps (layout::tp_overlap)
  double proj_gemm_s = 0;        // the row-parallel GEMMs: attention's output projection and
  double down_gemm_s = 0;        // the MLP's down projection (layout::tp_comm_overlap)
  double cast_s = 0;             // FP8: the forward's casts of the Linears' inputs (and, under
                                 // fp8_linear, of their weights)
  double grad_cast_s = 0;        // FP8: the backward's casts of the Linears' output gradients
  double weight_cast_s = 0;      // FP8 under Transformer Engine: the weights' casts, once a step
  [[nodiscard]] double total() const noexcept {
    return gemm_s + attention_s + elementwise_s + cast_s;
  }
};

[[nodiscard]] inline layer_cost layer_forward(const model_spec& m, double b, int t, bool sp,
                                              const gpu& g, const calibration& cal,
                                              precision p = precision::bf16) {
  const double T = b * m.seq, h = m.h(), f = m.f(), tt = t;
  const double up_width = f * (m.mlp_matrices() - 1) / tt;
  layer_cost c;
  c.qkv_gemm_s = detail::gemm_time(T, m.qkv_width() / tt, h, 1, g, cal, p);
  c.up_gemm_s = detail::gemm_time(T, up_width, h, 1, g, cal, p);
  c.proj_gemm_s = detail::gemm_time(T, h, h / tt, 1, g, cal, p);
  c.down_gemm_s = detail::gemm_time(T, h, f / tt, 1, g, cal, p);
  c.gemm_s = c.qkv_gemm_s + c.proj_gemm_s + c.up_gemm_s + c.down_gemm_s;
  const double heads = m.heads / tt * b;
  const double hd = h / m.heads;
  c.attention_s = 2.0 * detail::gemm_time(m.seq, m.seq, hd, heads, g, cal);
  const double hbm = g.hbm_bandwidth * cal.hbm_fraction;
  double bytes = 15.0 * T * h / (sp ? tt : 1.0) + (m.gated ? 6.0 : 4.0) * T * f / tt;
  if (!m.flash_attention)
    c.core_elementwise_s = 9.0 * heads * m.seq * static_cast<double>(m.seq) / hbm;
  c.elementwise_s = bytes / hbm + c.core_elementwise_s + cal.layer_overhead_s;
  if (p != precision::bf16) {
    // The Linears' (input width k, output width n) elements: inputs T k, output gradients T n,
    // weights k n, on one TP rank.
    const double inputs = T * (h + h / tt + h + f / tt);
    const double gradients = T * (m.qkv_width() / tt + h + up_width + h);
    const double weights = h * (m.qkv_width() / tt + h / tt + up_width) + f / tt * h;
    const double per_element = detail::cast_bytes(p) / hbm;
    c.cast_s = inputs * per_element;
    c.grad_cast_s = gradients * per_element;
    if (p == precision::fp8_linear)
      c.cast_s += weights * per_element;
    else
      c.weight_cast_s = weights * per_element;
  }
  return c;
}

} // namespace weft::sim
