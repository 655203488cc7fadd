#pragma once
// Schedule generators: policy types whose static make(stages, microbatches, options) returns
// the schedule (schedule.hpp) of every rank. Compute orders for p = 3 stages, m = 4
// microbatches (F/B/W of microbatch i; chunk 0 omitted):
//
//   gpipe           all forwards, then all backwards (backwards in microbatch order)
//     rank 0..2     F0 F1 F2 F3 B0 B1 B2 B3
//   one_f_one_b     Megatron-core's non-interleaved schedule: p - r - 1 warmup forwards
//                   (at most m), then one forward and one backward in turn, then the
//                   remaining backwards
//     rank 0        F0 F1 F2 B0 F3 B1 B2 B3
//     rank 1        F0 F1 B0 F2 B1 F3 B2 B3
//     rank 2        F0 B0 F1 B1 F2 B2 F3 B3
//   zero_bubble_h1  ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B's
//                   order with the backward split into B (input gradient, on the critical
//                   path) and W (weight gradient, needed by nobody downstream). W i follows
//                   B i, except that rank r holds back its first r W's to the end, where
//                   1F1B leaves it idle; no rank ever holds more than p microbatches' state,
//                   as 1F1B's rank 0 does. Equal costs: bubble (p-1)(T_F + T_B - T_W)
//                   against 1F1B's (p-1)(T_F + T_B + T_W).
//     rank 0        F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3
//     rank 1        F0 F1 B0 F2 B1 W1 F3 B2 W2 B3 W3 W0
//     rank 2        F0 B0 F1 B1 F2 B2 W2 F3 B3 W3 W0 W1
//   interleaved<V>  Megatron-core's interleaved schedule: V chunks per rank; forwards take
//                   microbatches in groups of G (default p), all chunks of a group before the
//                   next group; backwards the same with chunks reversed; warmup
//                   (p - r - 1) * 2 + (V - 1) * G forwards (at most m * V). p = 2, m = 4,
//                   V = 2 (tokens F<microbatch>.<chunk>):
//     rank 0        F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0
//     rank 1        F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0
//
// The sends and receives each order implies are added by from_compute_order().
#include <weft/core/error.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::pipeline {

/// What a generator takes besides (stages, microbatches).
struct options {
  int group_size = 0;               // interleaved: microbatches per group; 0: the number of stages
  std::size_t activation_bytes = 0; // the size of each activation message (sends after F)
  std::size_t gradient_bytes = 0;   // the size of each gradient message (sends after B)
};

// --- the index math, constexpr -------------------------------------------------------------

/// 1F1B's warmup forwards on `rank`: p - rank - 1, at most m.
constexpr int one_f_one_b_warmup(int stages, int rank, int microbatches) noexcept {
  return std::min(stages - rank - 1, microbatches);
}

/// The interleaved schedule's warmup forwards on `rank`: (p - rank - 1) * 2 + (V - 1) * G, at
/// most m * V (then all forwards run first, as in GPipe).
constexpr int interleaved_warmup(int stages, int rank, int chunks, int group,
                                 int microbatches) noexcept {
  return std::min((stages - rank - 1) * 2 + (chunks - 1) * group, microbatches * chunks);
}

/// The (microbatch, chunk) of the k-th forward of every rank in the interleaved schedule:
/// groups of `group` microbatches, each run through chunk 0, then chunk 1, ...; the last group
/// holds what is left (fewer than `group` when `group` does not divide m).
constexpr std::pair<int, int> interleaved_forward(int k, int microbatches, int chunks,
                                                  int group) noexcept {
  const int full_groups = (microbatches - 1) / group; // the groups before the last
  const int full_span = full_groups * group * chunks;
  int first = 0;
  int size = group;
  int j = 0;
  if (k < full_span) {
    first = k / (group * chunks) * group;
    j = k % (group * chunks);
  } else {
    first = full_groups * group;
    size = microbatches - first;
    j = k - full_span;
  }
  return {first + j % size, j / size};
}

/// The k-th backward: the k-th forward's microbatch, on the mirrored chunk (V - 1 - chunk),
/// since backwards run through the chunks in reverse.
constexpr std::pair<int, int> interleaved_backward(int k, int microbatches, int chunks,
                                                   int group) noexcept {
  const auto [mb, chunk] = interleaved_forward(k, microbatches, chunks, group);
  return {mb, chunks - 1 - chunk};
}

namespace detail {

inline void expect_positive(std::string_view generator, std::string_view what, int value) {
  if (value < 1) {
    throw error("weft: pipeline::" + std::string(generator) + ": " + std::string(what) +
                " must be at least 1, not " + std::to_string(value));
  }
}

/// The 1F1B shape every non-GPipe generator shares: `warmup` forwards, then one forward and
/// one backward in turn, then the remaining backwards; forward k / backward k are fwd(k) /
/// bwd(k). after_backward(k, out) may append (the W's of ZB-H1).
template <class Forward, class Backward, class AfterBackward>
std::vector<action> one_forward_one_backward(int total, int warmup, Forward fwd, Backward bwd,
                                             AfterBackward after_backward) {
  std::vector<action> out;
  out.reserve(static_cast<std::size_t>(total) * 3);
  const auto forward = [&](int k) {
    const auto [mb, chunk] = fwd(k);
    out.push_back(action{action_kind::forward, mb, chunk});
  };
  const auto backward = [&](int k) {
    const auto [mb, chunk] = bwd(k);
    out.push_back(action{action_kind::backward, mb, chunk});
    after_backward(k, out);
  };
  for (int k = 0; k < warmup; ++k)
    forward(k);
  for (int k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  for (int k = total - warmup; k < total; ++k)
    backward(k);
  return out;
}

inline std::pair<int, int> chunk0(int k) { return {k, 0}; }
inline void nothing_after(int, std::vector<action>&) {}

} // namespace detail

// --- the policies ---------------------------------------------------------------------------

struct gpipe {
  static constexpr std::string_view name = "gpipe";
  static constexpr bool split_backward = false;

  static schedule make(int stages, int microbatches, const options& o = {}) {
    detail::expect_positive(name, "stages", stages);
    detail::expect_positive(name, "microbatches", microbatches);
    std::vector<action> order;
    for (int i = 0; i < microbatches; ++i)
      order.push_back(action{action_kind::forward, i, 0});
    for (int i = 0; i < microbatches; ++i)
      order.push_back(action{action_kind::backward, i, 0});
    const std::vector<std::vector<action>> compute(static_cast<std::size_t>(stages), order);
    return from_compute_order(std::string(name), stages, microbatches, 1, false, compute,
                              o.activation_bytes, o.gradient_bytes);
  }
};

struct one_f_one_b {
  static constexpr std::string_view name = "1f1b";
  static constexpr bool split_backward = false;

  static schedule make(int stages, int microbatches, const options& o = {}) {
    detail::expect_positive(name, "stages", stages);
    detail::expect_positive(name, "microbatches", microbatches);
    std::vector<std::vector<action>> compute;
    for (int r = 0; r < stages; ++r) {
      compute.push_back(detail::one_forward_one_backward(
          microbatches, one_f_one_b_warmup(stages, r, microbatches), detail::chunk0, detail::chunk0,
          detail::nothing_after));
    }
    return from_compute_order(std::string(name), stages, microbatches, 1, false, compute,
                              o.activation_bytes, o.gradient_bytes);
  }
};

struct zero_bubble_h1 {
  static constexpr std::string_view name = "zb-h1";
  static constexpr bool split_backward = true;

  static schedule make(int stages, int microbatches, const options& o = {}) {
    detail::expect_positive(name, "stages", stages);
    detail::expect_positive(name, "microbatches", microbatches);
    if (microbatches < stages) {
      throw error("weft: pipeline::zb-h1: needs at least as many microbatches as stages, not " +
                  std::to_string(microbatches) + " for " + std::to_string(stages) + " stages");
    }
    std::vector<std::vector<action>> compute;
    for (int r = 0; r < stages; ++r) {
      // Rank r holds back W 0..r-1: its backwards start r steps of 1F1B earlier than rank 0's,
      // which leaves it r idle slots at the end for them.
      auto order = detail::one_forward_one_backward(
          microbatches, one_f_one_b_warmup(stages, r, microbatches), detail::chunk0, detail::chunk0,
          [r](int k, std::vector<action>& out) {
            if (k >= r) out.push_back(action{action_kind::weight, k, 0});
          });
      for (int k = 0; k < r; ++k)
        order.push_back(action{action_kind::weight, k, 0});
      compute.push_back(std::move(order));
    }
    return from_compute_order(std::string(name), stages, microbatches, 1, true, compute,
                              o.activation_bytes, o.gradient_bytes);
  }
};

namespace detail {

/// Megatron-core's interleaved schedule for a chunk count known at run time; its checks are
/// Megatron-core's.
inline schedule interleaved_schedule(int stages, int microbatches, int chunks, const options& o) {
  const std::string name = "interleaved<" + std::to_string(chunks) + ">";
  expect_positive(name, "stages", stages);
  expect_positive(name, "microbatches", microbatches);
  expect_positive(name, "chunks", chunks);
  const auto fail = [&](const std::string& what) {
    throw error("weft: pipeline::" + name + ": " + what);
  };
  if (chunks > 1 && stages < 2) {
    fail("model chunks need at least 2 stages (one stage runs without pipelining), not 1");
  }
  if (o.group_size < 0) fail("group size must be positive, or 0 for the number of stages");
  const int group = o.group_size == 0 ? stages : o.group_size;
  if (group < stages || group > microbatches) {
    fail("group size " + std::to_string(group) + " must lie in [stages, microbatches] = [" +
         std::to_string(stages) + ", " + std::to_string(microbatches) + "]");
  }
  const int rest = microbatches % group;
  if (rest != 0 && rest < stages) {
    fail(std::to_string(microbatches) + " microbatches are not a multiple of the group size " +
         std::to_string(group) + ", and the last group's " + std::to_string(rest) +
         " microbatches are fewer than the " + std::to_string(stages) +
         " stages: they would stall the pipeline");
  }
  const int total = microbatches * chunks;
  std::vector<std::vector<action>> compute;
  for (int r = 0; r < stages; ++r) {
    compute.push_back(one_forward_one_backward(
        total, interleaved_warmup(stages, r, chunks, group, microbatches),
        [&](int k) { return interleaved_forward(k, microbatches, chunks, group); },
        [&](int k) { return interleaved_backward(k, microbatches, chunks, group); },
        nothing_after));
  }
  return from_compute_order(name, stages, microbatches, chunks, false, compute, o.activation_bytes,
                            o.gradient_bytes);
}

} // namespace detail

template <int Chunks>
struct interleaved {
  static_assert(Chunks >= 1,
                "weft::pipeline::interleaved<V>: V counts the model chunks per "
                "rank and must be at least 1");
  static constexpr int chunks = Chunks;
  static constexpr bool split_backward = false;

  static schedule make(int stages, int microbatches, const options& o = {}) {
    return detail::interleaved_schedule(stages, microbatches, Chunks, o);
  }
};

// --- choosing at run time -------------------------------------------------------------------

enum class schedule_kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble_h1 };

/// The names weft-schedule's --schedule takes.
constexpr std::string_view name_of(schedule_kind k) noexcept {
  switch (k) {
    case schedule_kind::gpipe: return "gpipe";
    case schedule_kind::one_f_one_b: return "1f1b";
    case schedule_kind::interleaved: return "interleaved";
    case schedule_kind::zero_bubble_h1: return "zb-h1";
  }
  return "?";
}

/// The generator of `kind`, with V = `chunks` model chunks (1 unless interleaved).
inline schedule generate(schedule_kind kind, int stages, int microbatches, int chunks = 1,
                         const options& o = {}) {
  if (kind == schedule_kind::interleaved) {
    return detail::interleaved_schedule(stages, microbatches, chunks, o);
  }
  if (chunks != 1) {
    throw error("weft: pipeline::" + std::string(name_of(kind)) + ": runs one model chunk per " +
                "rank, not " + std::to_string(chunks) + " (only interleaved takes chunks)");
  }
  switch (kind) {
    case schedule_kind::gpipe: return gpipe::make(stages, microbatches, o);
    case schedule_kind::one_f_one_b: return one_f_one_b::make(stages, microbatches, o);
    case schedule_kind::zero_bubble_h1: return zero_bubble_h1::make(stages, microbatches, o);
    case schedule_kind::interleaved: break;
  }
  throw error("weft: pipeline: unknown schedule kind");
}

} // namespace weft::pipeline
