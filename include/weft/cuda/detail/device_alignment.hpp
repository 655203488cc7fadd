#pragma once
// The boundary on which every region that weft lays out in device memory starts: a plan's
// scratch and the temporaries its receives land in (detail/device_plan_layout.hpp,
// emulated.cuh), the regions of a p2p workspace (detail/p2p_plan.hpp), and the staging of the
// NCCL communicator's blocking calls (nccl.cuh). The copy and reduce kernels (kernels.cuh) move
// 16-byte packs, and a region on this boundary starts on whole lines.
#include <cstddef>

namespace weft::cuda::detail {

inline constexpr std::size_t device_alignment = 256;

/// `bytes` rounded up to device_alignment.
constexpr std::size_t device_aligned(std::size_t bytes) noexcept {
  return (bytes + device_alignment - 1) / device_alignment * device_alignment;
}

static_assert(device_aligned(0) == 0 && device_aligned(1) == 256 && device_aligned(256) == 256);

} // namespace weft::cuda::detail
