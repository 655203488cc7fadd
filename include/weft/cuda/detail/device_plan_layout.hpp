#pragma once
// How one rank's plan lands in device memory on a transport of messages (the NCCL
// communicator, weft/cuda/nccl.cuh): every step checked against its buffers before anything
// is queued, and each receive placed either straight in its destination or in a temporary of
// its round. The call's device scratch holds
//
//   | the plan's scratch (aligned) | the temporaries of one round (the largest round's) |
//
// Host logic only: nothing here calls CUDA or NCCL.
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/device_alignment.hpp>
#include <weft/cuda/detail/receive_landing.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::cuda::detail {

/// How one rank's plan runs on a device: every step checked, and each receive landing
/// either straight in its destination (temp[k] == direct) or in a temporary at byte offset
/// temp[k] of its round's temporaries, which follow the plan's scratch.
struct device_plan_layout {
  static constexpr std::size_t direct = lands_in_place;
  static constexpr std::size_t alignment = device_alignment; // of the scratch and every temporary

  std::vector<std::size_t> temp; // one per step
  std::size_t scratch_bytes = 0; // the plan's scratch, rounded up to the alignment
  std::size_t temp_bytes = 0;    // the most that one round's temporaries take

  [[nodiscard]] std::size_t bytes() const noexcept { return scratch_bytes + temp_bytes; }
  static constexpr std::size_t aligned(std::size_t bytes) noexcept { return device_aligned(bytes); }
};

/// Checks rank `rank`'s plan `pl` on `size` ranks against its buffers (sizes[b] elements of
/// element_size bytes; in_place: input and output are the same memory) and lays out its
/// temporaries by detail/receive_landing.hpp's rule: recv_reduce always lands in a temporary;
/// a recv does when an earlier step of its round touches an overlapping range of its
/// destination. buffer_phase[b] is buffer b's address mod pack_bytes (the scratch's 0: it
/// starts the device scratch); each temporary takes its destination's phase, so the copy or
/// reduce out of it runs in 16-byte packs.
/// Throws weft::error naming `operation` on a peer-access step, a peer outside the ranks, or
/// a range outside its buffer.
inline void lay_out(const plan& pl, int rank, int size, const std::size_t (&sizes)[3],
                    std::size_t element_size, bool in_place, const std::size_t (&buffer_phase)[3],
                    std::string_view operation, device_plan_layout& out) {
  const auto& steps = pl.steps();
  out.temp.assign(steps.size(), device_plan_layout::direct);
  out.scratch_bytes = device_plan_layout::aligned(pl.scratch_count() * element_size);
  out.temp_bytes = 0;
  struct refuse_peer_access : plan_check_hooks {
    int rank;
    std::string_view operation;
    void refuse(const step& s) const {
      throw error(
          operation, rank, error::unknown,
          "the plan has a " + std::string(name_of(s.kind)) +
              " step, which needs peer access, and NCCL ranks cannot read each other's memory");
    }
  } hooks{{}, rank, operation};
  check_plan_steps(
      pl,
      {.rank = rank, .size = size, .operation = operation, .sizes = sizes, .peer_access = false},
      hooks);
  for (const plan_round& r : rounds_of(steps)) {
    const std::size_t round_bytes = place_round_receives(
        std::span(steps).subspan(r.begin, r.end - r.begin), in_place, element_size, buffer_phase,
        std::span(out.temp).subspan(r.begin, r.end - r.begin));
    out.temp_bytes = std::max(out.temp_bytes, round_bytes);
  }
}

} // namespace weft::cuda::detail
