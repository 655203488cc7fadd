#pragma once
// The host side of the p2p transport (weft/cuda/p2p.cuh) that needs no device: where a rank's
// workspace keeps its flags, staging areas and data, where one call's plan lands in it, and the
// checks a call passes before anything is queued. (What a failed sync leaves, and the epochs'
// rules, are detail/p2p_epoch.hpp.)
//
// A rank's workspace, the same layout on every rank of a communicator:
//
//   | flags[size] | counters[size] | grid | staging 0 | staging 1 | staging 2 | data area ...  |
//     peers store   this rank's      fused   staged calls alternate 0 and 1;     a call's input,
//     their syncs   syncs with each  kernels captured ones use 2                 output and scratch
//                                    barrier
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/device_alignment.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace weft::cuda::detail {

/// The most ranks of one p2p communicator: a sync's kernel takes its members as arguments.
inline constexpr int p2p_max_ranks = 64;
/// Staging areas: two that non-captured staged calls alternate, one for captured calls.
inline constexpr int p2p_staging_areas = 3;
inline constexpr int p2p_captured_staging = 2;

/// Byte offsets in a rank's workspace.
struct p2p_workspace_layout {
  std::size_t flags = 0;    // flags[q]: the count of syncs rank q has made with this rank
  std::size_t counters = 0; // counters[q]: the count of syncs this rank has made with rank q;
                            // counters[rank]: its failed mark (detail/p2p_epoch.hpp)
  std::size_t grid = 0;     // the fused kernels' arrival counter and generation word
                            // (detail/p2p_fused.cuh), two 32-bit words
  std::size_t staging = 0;  // the first staging area; the others follow
  std::size_t staging_stride = 0;
  std::size_t data = 0; // the data area
  std::size_t data_bytes = 0;
  std::size_t total = 0;

  friend constexpr bool operator==(const p2p_workspace_layout&,
                                   const p2p_workspace_layout&) = default;
};

constexpr p2p_workspace_layout p2p_lay_out_workspace(int size, std::size_t data_bytes) noexcept {
  p2p_workspace_layout w;
  const std::size_t words = device_aligned(static_cast<std::size_t>(size) * sizeof(std::uint64_t));
  w.counters = words;
  w.grid = 2 * words;
  w.staging = w.grid + device_aligned(2 * sizeof(std::uint32_t));
  w.staging_stride = device_aligned(max_staged_scratch_bytes);
  w.data = w.staging + p2p_staging_areas * w.staging_stride;
  w.data_bytes = device_aligned(data_bytes);
  w.total = w.data + w.data_bytes;
  return w;
}

static_assert(p2p_lay_out_workspace(3, 1000).data % device_alignment == 0);
static_assert(p2p_lay_out_workspace(3, 1000).data_bytes == 1024);

/// Checks the options of a p2p communicator (before any device is touched).
inline void p2p_check_options(std::size_t workspace_bytes, std::chrono::milliseconds sync_timeout,
                              std::chrono::milliseconds timeout, std::string_view who) {
  const std::string w(who);
  if (workspace_bytes == 0) {
    throw error("weft: " + w +
                ": options::workspace_bytes is 0; a workspace holds each call's data (64 MiB by "
                "default)");
  }
  if (workspace_bytes > std::numeric_limits<std::size_t>::max() / 2) {
    throw error("weft: " + w + ": options::workspace_bytes of " + std::to_string(workspace_bytes) +
                " bytes is more than any device holds");
  }
  if (sync_timeout.count() <= 0) {
    throw error("weft: " + w + ": options::sync_timeout must be positive, not " +
                std::to_string(sync_timeout.count()) + " ms");
  }
  if (timeout.count() <= 0) {
    throw error("weft: " + w + ": options::timeout must be positive, not " +
                std::to_string(timeout.count()) + " ms");
  }
}

/// Checks run()'s device list: one entry per rank, at least one, at most p2p_max_ranks, none
/// negative. Whether the devices exist is checked where the device count is known.
inline void p2p_check_device_list(const std::vector<int>& devices, std::string_view who) {
  const std::string w(who);
  if (devices.empty()) {
    throw error(
        "weft: " + w +
        ": the device list is empty; give one CUDA device per rank (one device may repeat)");
  }
  if (devices.size() > static_cast<std::size_t>(p2p_max_ranks)) {
    throw error("weft: " + w + ": " + std::to_string(devices.size()) +
                " ranks; a p2p communicator has at most " + std::to_string(p2p_max_ranks));
  }
  for (std::size_t r = 0; r < devices.size(); ++r) {
    if (devices[r] < 0) {
      throw error("weft: " + w + ": rank " + std::to_string(r) + " is given device " +
                  std::to_string(devices[r]) + "; devices are CUDA ordinals, 0 and up");
    }
  }
}

/// Where one call runs. A staged plan (plan::stage) keeps the caller's buffers as its input and
/// output, since its peers load only its scratch, which is a staging area. Any other plan runs
/// in the data area, [input | output | scratch], each region sized by the collective (plan.hpp's
/// table), not by this rank's buffers, so that every rank finds a peer's region where its own
/// is; a broadcast's input is its output.
struct p2p_call_layout {
  bool staged = false;
  std::size_t offset[3] = {0, 0, 0};   // byte offset of each region in the data area (not staged)
  std::size_t capacity[3] = {0, 0, 0}; // elements of a peer's region that a load may read
  std::size_t region_bytes[3] = {0, 0, 0};
  std::size_t bytes = 0; // of the data area the call uses
};

/// a * b, or the largest size_t where that overflows (so that it never fits).
constexpr std::size_t p2p_saturating_product(std::size_t a, std::size_t b) noexcept {
  return b != 0 && a > std::numeric_limits<std::size_t>::max() / b
             ? std::numeric_limits<std::size_t>::max()
             : a * b;
}

constexpr std::size_t p2p_saturating_sum(std::size_t a, std::size_t b) noexcept {
  return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

/// The aligned bytes of a region of n elements (saturating: a region too large never fits).
constexpr std::size_t p2p_region_bytes(std::size_t n, std::size_t element_size) noexcept {
  const std::size_t bytes = p2p_saturating_product(n, element_size);
  return bytes > std::numeric_limits<std::size_t>::max() - device_alignment ? bytes
                                                                            : device_aligned(bytes);
}

/// The elements of the input and output regions of collective c of `count` on `size` ranks
/// (plan.hpp's table of buffer sizes): blocks of every rank where the collective takes them.
struct p2p_region_counts {
  std::size_t input = 0;
  std::size_t output = 0;
};

constexpr p2p_region_counts p2p_region_elements(collective c, std::size_t size,
                                                std::size_t count) noexcept {
  const bool blocks_in = input_per_rank(c);
  const bool blocks_out = output_per_rank(c);
  const std::size_t in = blocks_in ? p2p_saturating_product(count, size) : count;
  const std::size_t out = blocks_out ? p2p_saturating_product(count, size) : count;
  return {c == collective::broadcast ? out : in, out};
}

/// Bytes of the data area that a call of c of `count` takes with no scratch (direct's plans
/// that are not staged): the aligned input and output regions; a broadcast's input is its
/// output. Saturating: a call too large never fits.
constexpr std::size_t p2p_call_bytes(collective c, std::size_t size, std::size_t count,
                                     std::size_t element_size) noexcept {
  const p2p_region_counts n = p2p_region_elements(c, size, count);
  const std::size_t out = p2p_region_bytes(n.output, element_size);
  return c == collective::broadcast
             ? out
             : p2p_saturating_sum(p2p_region_bytes(n.input, element_size), out);
}

/// The largest count of collective c on `size` ranks whose regions (p2p_call_bytes) fit a data
/// area of data_bytes: the most one call of direct's takes, by bisection over the count (the
/// bytes grow with it). 0 where not even one element fits.
constexpr std::size_t p2p_max_count(collective c, int size, std::size_t element_size,
                                    std::size_t data_bytes) noexcept {
  const auto p = static_cast<std::size_t>(size);
  std::size_t hi = data_bytes / element_size; // a region holds no more
  if (p2p_call_bytes(c, p, hi, element_size) <= data_bytes) return hi;
  std::size_t lo = 0; // fits; hi does not
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (p2p_call_bytes(c, p, mid, element_size) <= data_bytes ? lo : hi) = mid;
  }
  return lo;
}

static_assert(p2p_max_count(collective::all_reduce, 4, 4, 1024) == 128);
static_assert(p2p_max_count(collective::broadcast, 4, 4, 1024) == 256);
static_assert(p2p_max_count(collective::all_gather, 4, 4, 1024) == 48); // 256 B in, 768 out

inline std::string_view p2p_buffer_name(buffer b) noexcept {
  switch (b) {
    case buffer::input: return "input";
    case buffer::output: return "output";
    case buffer::scratch: return "scratch";
  }
  return "?";
}

/// Checks rank `rank`'s plan on `size` ranks against its buffers (sizes[b] elements of
/// element_size bytes) and a data area of data_bytes, and lays the call out. Throws weft::error
/// naming `operation` where the plan cannot run here: a message step (send, recv, recv_reduce:
/// p2p runs peer-access plans only), a staged plan that loads anything but its peers' staging
/// area or needs more staging than there is, a group or rank outside the communicator, a range
/// outside a buffer, or a call whose regions do not fit the data area.
inline p2p_call_layout p2p_lay_out_call(const plan& pl, int rank, int size,
                                        const std::size_t (&sizes)[3], std::size_t element_size,
                                        std::size_t data_bytes, std::string_view operation) {
  check_plan_rank(pl, rank, size, operation);
  p2p_call_layout lay;
  lay.staged = pl.staged();
  const collective c = pl.coll();
  const auto p = static_cast<std::size_t>(size);
  const std::size_t count = pl.count();
  // The regions' sizes in elements, from plan.hpp's table of buffer sizes.
  const p2p_region_counts region = p2p_region_elements(c, p, count);
  const std::size_t in_cap = region.input;
  const std::size_t out_cap = region.output;
  const std::size_t caps[2] = {in_cap, out_cap};
  for (int b = 0; b < 2; ++b) {
    if (sizes[b] > caps[b]) {
      throw error(operation, rank, error::unknown,
                  "the " + std::string(p2p_buffer_name(static_cast<buffer>(b))) + " has " +
                      std::to_string(sizes[b]) + " elements, and " + std::string(name_of(c)) +
                      " of " + std::to_string(count) + " on " + std::to_string(size) +
                      " ranks takes at most " + std::to_string(caps[b]));
    }
  }
  if (lay.staged) {
    const std::size_t staging = p2p_saturating_product(pl.scratch_count(), element_size);
    if (staging > max_staged_scratch_bytes) {
      throw error(operation, rank, error::unknown,
                  "a staged plan needs " + std::to_string(staging) +
                      " bytes of staging; the p2p transport has " +
                      std::to_string(max_staged_scratch_bytes));
    }
    lay.capacity[static_cast<std::size_t>(buffer::scratch)] =
        max_staged_scratch_bytes / element_size;
  } else {
    // A broadcast's input is its output: no region of its own.
    lay.region_bytes[0] = c == collective::broadcast ? 0 : p2p_region_bytes(in_cap, element_size);
    lay.region_bytes[1] = p2p_region_bytes(out_cap, element_size);
    lay.region_bytes[2] = p2p_region_bytes(pl.scratch_count(), element_size);
    lay.offset[1] = lay.region_bytes[0];
    lay.offset[2] = p2p_saturating_sum(lay.offset[1], lay.region_bytes[1]);
    lay.bytes = p2p_saturating_sum(lay.offset[2], lay.region_bytes[2]);
    if (lay.bytes > data_bytes) {
      throw error(operation, rank, error::unknown,
                  std::string(name_of(c)) + " of " + std::to_string(count) + " elements of " +
                      std::to_string(element_size) + " bytes on " + std::to_string(size) +
                      " ranks needs " + std::to_string(lay.bytes) + " bytes of workspace (input " +
                      std::to_string(lay.region_bytes[0]) + ", output " +
                      std::to_string(lay.region_bytes[1]) + ", scratch " +
                      std::to_string(lay.region_bytes[2]) +
                      "), and this communicator's workspace has " + std::to_string(data_bytes) +
                      ": create the communicator with a larger p2p::options::workspace_bytes, or "
                      "run calls this "
                      "large on another transport");
    }
    lay.capacity[0] = in_cap;
    lay.capacity[1] = out_cap;
    lay.capacity[2] =
        (data_bytes - lay.offset[2]) / element_size; // a peer's scratch may be larger than mine
  }

  // What p2p adds to the common checks: message steps refused, a staged plan's loads kept to
  // the staging areas, a peer's range within its region, and groups that a sync kernel can
  // take (no rank twice; a reduction over at least one).
  struct p2p_rules : plan_check_hooks {
    const p2p_call_layout& lay;
    int rank;
    std::string_view operation;

    void refuse(const step& s) const {
      throw error(operation, rank, s.peer,
                  "the plan has a " + std::string(name_of(s.kind)) +
                      " step: the p2p transport runs peer-access plans only (algo::direct); use "
                      "algo::direct, or "
                      "a transport with messages (nccl, emulated) for ring, tree and the other "
                      "algorithms");
    }
    // Each member's thread of the sync kernel counts its syncs with that rank: a rank named
    // twice would count one sync twice.
    void member(const plan& p, int g, std::size_t i) const {
      const auto& members = p.group(g);
      const auto end = members.begin() + static_cast<std::ptrdiff_t>(i);
      if (std::find(members.begin(), end, members[i]) != end) {
        throw error(operation, rank, members[i],
                    "plan group " + std::to_string(g) + " names this rank twice");
      }
    }
    void reduces_over(const plan& p, int g) const {
      if (p.group(g).empty()) {
        throw error(operation, rank, error::unknown,
                    "plan reduces over group " + std::to_string(g) + ", which is empty");
      }
    }
    // A load from rank q's buffer b: this rank's own buffer (checked by the common checks), or
    // a peer's region of the workspace.
    void load_from(int q, buffer b, std::size_t off, std::size_t n) const {
      if (lay.staged) check_staged_load(b == buffer::scratch, operation, rank, q);
      if (q == rank) return;
      static constexpr std::string_view regions[3] = {
          "a peer's input region", "a peer's output region", "a peer's scratch region"};
      const auto i = static_cast<std::size_t>(b);
      check_peer_range(off, n, lay.capacity[i], regions[i], operation, rank, q);
    }
  } rules{{}, lay, rank, operation};
  check_plan_steps(
      pl, {.rank = rank, .size = size, .operation = operation, .sizes = sizes, .messages = false},
      rules);
  return lay;
}

} // namespace weft::cuda::detail
