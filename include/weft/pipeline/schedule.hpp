#pragma once
// A pipeline schedule is data: for each stage (rank), the ordered list of what it does. A
// generator (generators.hpp) writes it, validate() checks it, the simulator prices it
// (stats.hpp), an executor runs it.
//
// Compute actions are F (forward), B (backward: only the input gradient when the schedule
// splits the backward, the whole backward otherwise) and W (weight gradient, split schedules
// only), each for one (microbatch, model chunk). Rank r runs its chunks c = 0..V-1 as the
// virtual stages v = c*p + r, so a microbatch's forward visits every rank once per chunk:
//
//   p = 2, V = 2:   r0/c0 (v0) -> r1/c0 (v1) -> r0/c1 (v2) -> r1/c1 (v3)    backward: reversed
//
// The point-to-point actions a compute order implies sit in the same list: a rank receives
// just before the action that consumes the message and sends just after the one that made it.
// 1F1B with p = 2, m = 2:
//
//   rank 0:  F0.0 send:F0.0->1 F1.0 send:F1.0->1 recv:B0.0<-1 B0.0 recv:B1.0<-1 B1.0
//   rank 1:  recv:F0.0<-0 F0.0 B0.0 send:B0.0->0 recv:F1.0<-0 F1.0 B1.0 send:B1.0->0
//
// A message is identified by what it carries (activation or gradient, microbatch, producing
// virtual stage: message_tag), not by its position in the stream, so executors tag their
// sends and receives with it and a rank may receive in another order than its peer sends.
#include <weft/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft::pipeline {

enum class action_kind : std::uint8_t {
  forward,
  backward,
  weight,
  send_activation, // after F: its output, to the next virtual stage
  recv_activation, // before F: its input, from the previous virtual stage
  send_gradient,   // after B: its input gradient, to the previous virtual stage
  recv_gradient,   // before B: its output gradient, from the next virtual stage
};

constexpr bool is_compute(action_kind k) noexcept { return k <= action_kind::weight; }
constexpr bool is_send(action_kind k) noexcept {
  return k == action_kind::send_activation || k == action_kind::send_gradient;
}
constexpr bool is_recv(action_kind k) noexcept {
  return k == action_kind::recv_activation || k == action_kind::recv_gradient;
}

/// One entry of a rank's list. A send or receive carries the (microbatch, chunk) of the local
/// compute action it belongs to: the F or B that produced the message, or that consumes it.
struct action {
  action_kind kind = action_kind::forward;
  int microbatch = 0;
  int chunk = 0;
  int peer = -1;         // send/recv: the other rank
  std::size_t bytes = 0; // send/recv: the message size

  friend constexpr bool operator==(const action&, const action&) = default;
};

/// "F3.1", "B3.1", "W3.1"; "send:F3.1->2" (F3.1's output), "recv:F3.1<-1" (F3.1's input),
/// "send:B3.1->0", "recv:B3.1<-2".
inline std::string token(const action& a) {
  const auto id = std::to_string(a.microbatch) + "." + std::to_string(a.chunk);
  const auto peer = std::to_string(a.peer);
  switch (a.kind) {
    case action_kind::forward: return "F" + id;
    case action_kind::backward: return "B" + id;
    case action_kind::weight: return "W" + id;
    case action_kind::send_activation: return "send:F" + id + "->" + peer;
    case action_kind::recv_activation: return "recv:F" + id + "<-" + peer;
    case action_kind::send_gradient: return "send:B" + id + "->" + peer;
    case action_kind::recv_gradient: return "recv:B" + id + "<-" + peer;
  }
  return "?";
}

struct schedule {
  std::string name;            // the generator's, e.g. "1f1b"; names the schedule in errors
  int stages = 0;              // p, the ranks
  int microbatches = 0;        // m
  int chunks = 1;              // V, model chunks per rank
  bool split_backward = false; // B is the input gradient only, and W follows separately
  std::vector<std::vector<action>> ranks; // ranks[r]: rank r's actions, in order

  [[nodiscard]] constexpr int virtual_stages() const noexcept { return stages * chunks; }
  [[nodiscard]] constexpr int virtual_stage(int rank, int chunk) const noexcept {
    return chunk * stages + rank;
  }
  [[nodiscard]] constexpr int rank_of(int virtual_stage) const noexcept {
    return virtual_stage % stages;
  }

  /// Rank r's compute actions (F, B, W) in order, without the sends and receives.
  [[nodiscard]] std::vector<action> compute(int rank) const {
    std::vector<action> out;
    for (const action& a : ranks.at(static_cast<std::size_t>(rank)))
      if (is_compute(a.kind)) out.push_back(a);
    return out;
  }

  /// The identity of the message a send or receive of `rank` carries; a send and the receive
  /// it pairs with have the same tag. In [0, 2 * microbatches * virtual_stages).
  [[nodiscard]] std::size_t message_tag(int rank, const action& a) const {
    const int v = virtual_stage(rank, a.chunk);
    int producer = v;
    bool gradient = false;
    switch (a.kind) {
      case action_kind::send_activation: break;
      case action_kind::recv_activation: producer = v - 1; break;
      case action_kind::send_gradient: gradient = true; break;
      case action_kind::recv_gradient:
        gradient = true;
        producer = v + 1;
        break;
      default: throw error("weft: pipeline: message_tag of " + token(a) + ", which is no message");
    }
    const auto vs = static_cast<std::size_t>(virtual_stages());
    return (static_cast<std::size_t>(a.microbatch) * vs + static_cast<std::size_t>(producer)) * 2 +
           (gradient ? 1 : 0);
  }
};

/// A schedule from per-rank compute orders (F, B and W only), with the sends and receives they
/// imply inserted next to them: a receive just before the consumer, a send just after the
/// producer, none where both virtual stages are on the same rank (p = 1). Checks nothing about
/// the orders themselves: that is validate()'s job.
inline schedule from_compute_order(std::string name, int stages, int microbatches, int chunks,
                                   bool split_backward,
                                   const std::vector<std::vector<action>>& compute,
                                   std::size_t activation_bytes, std::size_t gradient_bytes) {
  if (stages < 1 || chunks < 1 || static_cast<int>(compute.size()) != stages) {
    throw error("weft: pipeline: schedule '" + name + "' built from " +
                std::to_string(compute.size()) + " compute orders for " + std::to_string(stages) +
                " stages of " + std::to_string(chunks) + " chunks");
  }
  schedule s{std::move(name), stages, microbatches, chunks, split_backward, {}};
  s.ranks.resize(compute.size());
  const int last = s.virtual_stages() - 1;
  for (int r = 0; r < stages; ++r) {
    auto& out = s.ranks[static_cast<std::size_t>(r)];
    for (const action& a : compute[static_cast<std::size_t>(r)]) {
      const int v = s.virtual_stage(r, a.chunk);
      const auto message = [&](action_kind k, int peer, std::size_t bytes) {
        out.push_back(action{k, a.microbatch, a.chunk, peer, bytes});
      };
      const bool prev_remote = v > 0 && s.rank_of(v - 1) != r;
      const bool next_remote = v < last && s.rank_of(v + 1) != r;
      if (a.kind == action_kind::forward && prev_remote)
        message(action_kind::recv_activation, s.rank_of(v - 1), activation_bytes);
      if (a.kind == action_kind::backward && next_remote)
        message(action_kind::recv_gradient, s.rank_of(v + 1), gradient_bytes);
      out.push_back(action{a.kind, a.microbatch, a.chunk, -1, 0});
      if (a.kind == action_kind::forward && next_remote)
        message(action_kind::send_activation, s.rank_of(v + 1), activation_bytes);
      if (a.kind == action_kind::backward && prev_remote)
        message(action_kind::send_gradient, s.rank_of(v - 1), gradient_bytes);
    }
  }
  return s;
}

/// One line per rank, "rank R: " and its compute actions as tokens separated by single
/// spaces: "rank 3: F0.0 B0.0 F1.0 B1.0". Each line ends with a newline.
inline std::string to_text(const schedule& s) {
  std::string out;
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const action& a : s.ranks[static_cast<std::size_t>(r)])
      if (is_compute(a.kind)) out += " " + token(a);
    out += "\n";
  }
  return out;
}

} // namespace weft::pipeline
