#pragma once
// Compute of one transformer layer on one GPU: GEMMs by calibration.hpp's efficiency model,
// the attention core, and the elementwise kernels at HBM speed.
#include <weft/sim/calibration.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>

#include <algorithm>

namespace weft::sim {

namespace detail {

/// Seconds of a GEMM m x n x k (times `batch` independent ones) on `g`.
inline double gemm_time(double m, double n, double k, double batch, const gpu& g,
                        const calibration& cal) {
  const auto q = [&](double d) { return d / (d + cal.gemm_half_dim); };
  const double eff = cal.gemm_peak_fraction * q(m) * q(n) * q(k);
  const double compute = 2.0 * m * n * k * batch / (g.peak_flops * eff);
  const double traffic =
      2.0 * (m * k + k * n + m * n) * batch / (g.hbm_bandwidth * cal.hbm_fraction);
  return std::max(compute, traffic);
}

} // namespace detail

/// Compute seconds of one layer's forward on one TP rank, for a micro-batch of b sequences,
/// without communication: the GEMMs, the attention core, and the elementwise kernels. Their
/// bytes per token, an estimate: 15h for the two layer norms (each reads and writes h 16-bit
/// values: 8h) and the two fused bias-dropout-residual adds (7h in all), replicated on every
/// TP rank unless sequence parallel; the activation function reads and writes f/t 16-bit
/// values (4f/t; 6f/t gated); the attention core's softmax and dropout read and write the
/// b a/t s^2 scores (9 bytes each: 2+2 softmax, 2+2 dropout, a 1-byte mask) unless fused.
struct layer_cost {
  double gemm_s = 0;
  double attention_s = 0;
  double elementwise_s = 0;      // all of them, core_elementwise_s included
  double core_elementwise_s = 0; // the attention core's softmax and dropout (0 when fused)
  double qkv_gemm_s = 0;         // the column-parallel GEMMs, whose backward collectives
  double up_gemm_s = 0;          // Megatron-LM overlaps (layout::tp_overlap)
  double proj_gemm_s = 0;        // the row-parallel GEMMs: attention's output projection and
  double down_gemm_s = 0;        // the MLP's down projection (layout::tp_comm_overlap)
  [[nodiscard]] double total() const noexcept { return gemm_s + attention_s + elementwise_s; }
};

[[nodiscard]] inline layer_cost layer_forward(const model_spec& m, double b, int t, bool sp,
                                              const gpu& g, const calibration& cal) {
  const double T = b * m.seq, h = m.h(), f = m.f(), tt = t;
  layer_cost c;
  c.qkv_gemm_s = detail::gemm_time(T, m.qkv_width() / tt, h, 1, g, cal);
  c.up_gemm_s = detail::gemm_time(T, f * (m.mlp_matrices() - 1) / tt, h, 1, g, cal);
  c.proj_gemm_s = detail::gemm_time(T, h, h / tt, 1, g, cal);
  c.down_gemm_s = detail::gemm_time(T, h, f / tt, 1, g, cal);
  c.gemm_s = c.qkv_gemm_s + c.proj_gemm_s + c.up_gemm_s + c.down_gemm_s;
  const double heads = m.heads / tt * b;
  const double hd = h / m.heads;
  c.attention_s = 2.0 * detail::gemm_time(m.seq, m.seq, hd, heads, g, cal);
  const double hbm = g.hbm_bandwidth * cal.hbm_fraction;
  double bytes = 15.0 * T * h / (sp ? tt : 1.0) + (m.gated ? 6.0 : 4.0) * T * f / tt;
  if (!m.flash_attention)
    c.core_elementwise_s = 9.0 * heads * m.seq * static_cast<double>(m.seq) / hbm;
  c.elementwise_s = bytes / hbm + c.core_elementwise_s + cal.layer_overhead_s;
  return c;
}

} // namespace weft::sim
