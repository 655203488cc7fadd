#pragma once
// The machines the simulator prices a training step on: GPU presets (peak dense bf16 FLOP/s,
// HBM size and bandwidth) and node presets (the topology presets of weft::topology: NVLink /
// NVSwitch inside a node, InfiniBand NICs between nodes), paired into a `machine`.
//
//   machine = gpu x topology::cluster
//     gpu       what one device computes: peak FLOP/s, HBM bytes and bytes/s
//     cluster   how devices talk: nodes x devices, intra and inter link, NICs per node
//
// Figures are the vendors' datasheets (dense, without sparsity): NVIDIA A100 Tensor Core GPU
// datasheet (80GB SXM: 312 TFLOP/s bf16, 80 GB HBM2e, 2,039 GB/s; 40GB SXM: 312 TFLOP/s,
// 40 GB HBM2, 1,555 GB/s), NVIDIA H100 Tensor Core
// GPU datasheet (SXM5: 989 TFLOP/s bf16 dense, 1,979 TFLOP/s FP8 dense, 80 GB HBM3, 3.35 TB/s),
// NVIDIA H200 datasheet (SXM: 989 TFLOP/s bf16 dense, 1,979 TFLOP/s FP8 dense, 141 GB HBM3e,
// 4.8 TB/s); the A100 has no FP8 tensor cores. Node links: topology.hpp's dgx_*.
#include <weft/core/error.hpp>
#include <weft/topology/topology.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace weft::sim {

/// One accelerator.
struct gpu {
  std::string_view name;    // the preset's name, as weft-plan --gpu takes it
  double peak_flops = 0;    // dense bf16 tensor-core FLOP/s
  double hbm_bytes = 0;     // memory a layout may use: the marketed GB in decimal bytes (80e9 is
                            // 74.5 GiB of the A100's 80 GiB), which leaves ~5 GiB for the CUDA
                            // context, NCCL's buffers, workspaces and fragmentation
  double hbm_bandwidth = 0; // bytes/s
  double fp8_flops = 0;     // dense FP8 (E4M3, E5M2) tensor-core FLOP/s; 0: no FP8 tensor cores
};

inline constexpr gpu a100_80gb{"a100-80gb", 312e12, 80e9, 2.039e12};
inline constexpr gpu a100_40gb{"a100-40gb", 312e12, 40e9, 1.555e12};
inline constexpr gpu h100_sxm{"h100-sxm", 989e12, 80e9, 3.35e12, 1979e12};
inline constexpr gpu h200_sxm{"h200", 989e12, 141e9, 4.8e12, 1979e12};

inline constexpr gpu gpu_presets[] = {a100_80gb, a100_40gb, h100_sxm, h200_sxm};

/// The preset named `name` ("a100-80gb", "a100", "a100-40gb", "h100-sxm", "h100", "h200").
[[nodiscard]] inline gpu gpu_named(std::string_view name) {
  if (name == "a100") return a100_80gb;
  if (name == "h100") return h100_sxm;
  for (const gpu& g : gpu_presets)
    if (g.name == name) return g;
  throw error("weft: sim: unknown GPU '" + std::string(name) +
              "': expected a100-80gb, a100-40gb, h100-sxm or h200");
}

/// A cluster of one GPU type.
struct machine {
  gpu device;
  topology::cluster cluster;
};

/// The DGX node of `g` (DGX A100, DGX H100, DGX H200), `nodes` of them. The A100 40GB's is
/// the DGX A100 (320GB): the same NVLink and NICs, its HBM's bandwidth.
[[nodiscard]] inline machine dgx(const gpu& g, int nodes) {
  if (g.name == a100_80gb.name) return {g, topology::dgx_a100(nodes)};
  if (g.name == a100_40gb.name) {
    const topology::cluster c = topology::dgx_a100(nodes);
    return {g, topology::cluster(c.devices_per_node(), c.intra(), c.inter(), c.nics_per_node(),
                                 g.hbm_bandwidth)};
  }
  if (g.name == h100_sxm.name) return {g, topology::dgx_h100(nodes)};
  if (g.name == h200_sxm.name) return {g, topology::dgx_h200(nodes)};
  throw error("weft: sim: no DGX preset for GPU '" + std::string(g.name) + "'");
}

} // namespace weft::sim
