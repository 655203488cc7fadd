#pragma once
// Pipeline engines: the presets of whose software runs a layout's stages (Megatron-LM's or
// DeepSpeed's), as the layout's send and DP-reduction settings.
#include <weft/core/error.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/sim/layout.hpp>

#include <string>
#include <string_view>

namespace weft::sim {

/// Whose pipeline engine runs a layout's stages. `megatron`, Megatron-LM's (the layout's defaults):
/// each TP rank sends 1/tp of an activation (SC21 4.1) and the sends overlap compute; the DP
/// reduction runs in buckets behind the last backward. `deepspeed`, DeepSpeed's PipelineEngine
/// (MT-NLG, BLOOM): whole activations, sends and receives that hold the rank, and the DP reduction
/// after the last micro-batch's backward; it runs 1F1B only, under ZeRO 0 or 1.
enum class pipeline_engine { megatron, deepspeed };

[[nodiscard]] constexpr std::string_view name_of(pipeline_engine e) noexcept {
  return e == pipeline_engine::deepspeed ? "deepspeed" : "megatron";
}

[[nodiscard]] inline pipeline_engine pipeline_engine_named(std::string_view s) {
  for (pipeline_engine e : {pipeline_engine::megatron, pipeline_engine::deepspeed})
    if (name_of(e) == s) return e;
  throw error("weft: sim: unknown pipeline engine '" + std::string(s) +
              "': expected megatron or deepspeed");
}

/// Why engine `e` cannot run `l` ("" if it can).
[[nodiscard]] inline std::string engine_refusal(const layout& l, pipeline_engine e) {
  if (e != pipeline_engine::deepspeed) return "";
  if (l.pp < 2)
    return "DeepSpeed's pipeline engine runs pipelines of 2 stages or more, not pp " +
           std::to_string(l.pp);
  if (l.schedule != pipeline::schedule_kind::one_f_one_b)
    return "DeepSpeed's pipeline engine runs 1F1B only, not " +
           std::string(pipeline::name_of(l.schedule));
  if (l.zero > 1)
    return "DeepSpeed's pipeline engine runs under ZeRO 0 or 1, not ZeRO-" + std::to_string(l.zero);
  return "";
}

/// Sets `l`'s sends and DP reduction to engine `e`'s; throws if `e` cannot run `l`.
inline void use_engine(layout& l, pipeline_engine e) {
  if (const std::string why = engine_refusal(l, e); !why.empty()) throw error("weft: sim: " + why);
  const bool ds = e == pipeline_engine::deepspeed;
  l.p2p_scatter_gather = !ds;
  l.p2p_blocking = ds;
  l.overlap_dp = !ds;
}

/// The engine whose sends `l` prices: DeepSpeed's where they hold the rank.
[[nodiscard]] inline pipeline_engine engine_of(const layout& l) noexcept {
  return l.p2p_blocking ? pipeline_engine::deepspeed : pipeline_engine::megatron;
}

} // namespace weft::sim
