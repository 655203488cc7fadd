#pragma once
// Where a round's messages land on a device transport (the NCCL and the emulated
// communicators). Both queue a round's receives before its local steps, so a receive written
// straight into its destination would overtake an earlier step of its round that reads or
// writes the same elements. The rule: a recv lands in place unless an earlier step of its
// round touches an overlapping range of the rank's own memory; a recv_reduce always takes a
// temporary, since its reduction is a local step of its own.
//
// The rule compares buffers and element offsets, with input and output one buffer when the
// call is in place. Both communicators refuse input and output that overlap without being
// one buffer (plan_runs_in_place, comm/plan/check.hpp), so this is exact, and it needs no
// address: NCCL sizes its device scratch from the temporaries before the scratch exists.
//
// Host logic only: nothing here calls CUDA.
#include <weft/comm/plan.hpp>
#include <weft/cuda/detail/device_alignment.hpp>

#include <cstddef>
#include <span>

namespace weft::cuda::detail {

/// Marks a step whose message lands in its destination (or that receives nothing).
inline constexpr std::size_t lands_in_place = static_cast<std::size_t>(-1);

/// A range of a rank's own buffer, in elements (input and output one buffer in place).
struct touched_range {
  buffer in = buffer::input;
  std::size_t offset = 0;
  std::size_t count = 0;

  [[nodiscard]] constexpr bool overlaps(const touched_range& o) const noexcept {
    return count != 0 && o.count != 0 && in == o.in && offset < o.offset + o.count &&
           o.offset < offset + count;
  }
};

/// The range of its own memory that step s reads (reads == true) or writes.
[[nodiscard]] constexpr touched_range touched(const step& s, bool reads, bool in_place) noexcept {
  const auto at = [&](buffer b, std::size_t offset) {
    return touched_range{in_place && b == buffer::output ? buffer::input : b, offset, s.count};
  };
  if (reads) {
    switch (s.kind) {
      case step_kind::send:
      case step_kind::recv_reduce:
      case step_kind::copy:
      case step_kind::reduce:
      case step_kind::load_reduce: return at(s.src, s.src_offset);
      default: return {};
    }
  }
  switch (s.kind) {
    case step_kind::send:
    case step_kind::sync: return {};
    default: return at(s.dst, s.dst_offset);
  }
}

/// The byte phase, mod pack_bytes, that the temporary of a receive into `dst_offset` of a
/// buffer starting at phase `buffer_phase` takes: the destination's own, so that the copy or
/// reduce from the temporary into the destination runs in 16-byte packs from the same element
/// on (split_for_packs, comm/detail/elementwise.hpp).
inline constexpr std::size_t pack_bytes = 16;

[[nodiscard]] constexpr std::size_t landing_phase(std::size_t buffer_phase, std::size_t dst_offset,
                                                  std::size_t element_size) noexcept {
  return (buffer_phase + dst_offset % pack_bytes * element_size) % pack_bytes;
}

/// Where the messages of one round land: offsets[k] becomes round[k]'s byte offset in the
/// round's temporaries, or lands_in_place. Each temporary starts on a boundary of
/// device_alignment plus the phase of its destination (landing_phase, with
/// buffer_phase[b] the address of buffer b mod pack_bytes; input and output one buffer in
/// place), so that the temporaries' base on a boundary of device_alignment puts every
/// temporary at its destination's address mod 16. Returns the bytes of temporaries the round
/// needs, a multiple of device_alignment.
inline std::size_t place_round_receives(std::span<const step> round, bool in_place,
                                        std::size_t element_size,
                                        const std::size_t (&buffer_phase)[3],
                                        std::span<std::size_t> offsets) {
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < round.size(); ++k) {
    const step& s = round[k];
    offsets[k] = lands_in_place;
    if (s.kind != step_kind::recv && s.kind != step_kind::recv_reduce) continue;
    bool temporary = s.kind == step_kind::recv_reduce;
    const touched_range dst = touched(s, false, in_place);
    for (std::size_t j = 0; j < k && !temporary; ++j) {
      temporary = dst.overlaps(touched(round[j], true, in_place)) ||
                  dst.overlaps(touched(round[j], false, in_place));
    }
    if (temporary) {
      offsets[k] = bytes + landing_phase(buffer_phase[static_cast<std::size_t>(s.dst)],
                                         s.dst_offset, element_size);
      bytes = device_aligned(offsets[k] + s.count * element_size);
    }
  }
  return bytes;
}

} // namespace weft::cuda::detail
