#pragma once
// validate(schedule): is this a pipeline step that can run? Two passes.
//
//   1. Each rank's list on its own, in order. Every (microbatch, chunk) is forwarded once and
//      backwarded once (and W'd once when the backward is split); B comes after its F, W
//      after its B. An F whose input comes from another rank is preceded by the receive of
//      that input and followed by the send of its output (unless it is the last virtual
//      stage); a B likewise with gradients, in the other direction. Where the neighbouring
//      virtual stage is on the same rank (p = 1), the neighbour's F (or B) comes first in the
//      list instead. Every send goes to the rank that runs its consumer, and a receive's size
//      is its send's. Together these make sends and receives pair up one to one.
//   2. The whole step on an abstract model of the stages: each rank runs its list in order,
//      a send never blocks, a receive blocks until its message has been sent. If every rank
//      reaches its end, the step completes without deadlock, and since each message is sent
//      after its producer and received before its consumer, every F, B and W ran after what
//      it depends on (F of v after F of v-1, B of v after B of v+1 and F of v).
//
// The first offending action (the lowest rank, then the lowest index in its list) is named in
// the weft::error: "validating schedule 1f1b on rank 2: action 7 (B0.0): ...". The same model,
// given durations, is the event simulation of stats.hpp.
#include <weft/core/error.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace weft::pipeline {

namespace detail {

/// When each action of a run starts and ends: for a receive, the wait for its message.
struct run_times {
  std::vector<std::vector<double>> start;
  std::vector<std::vector<double>> end;
};

/// Runs a structurally valid schedule on the abstract model: duration(rank, action) is the
/// time a compute action takes, transit(action) the time from a send until its message can be
/// received. Throws weft::error naming every rank left blocked if the step deadlocks.
template <class Duration, class Transit>
run_times run(const schedule& s, const std::string& operation, Duration duration, Transit transit) {
  const auto p = static_cast<std::size_t>(s.stages);
  const std::size_t messages =
      2 * static_cast<std::size_t>(s.microbatches) * static_cast<std::size_t>(s.virtual_stages());
  std::vector<char> sent(messages, 0);
  std::vector<double> arrival(messages, 0.0);
  std::vector<int> waiter(messages, -1); // the rank blocked on each message, if any
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  run_times t;
  t.start.resize(p);
  t.end.resize(p);
  for (std::size_t r = 0; r < p; ++r) {
    t.start[r].resize(s.ranks[r].size());
    t.end[r].resize(s.ranks[r].size());
  }
  std::vector<int> runnable;
  for (int r = s.stages - 1; r >= 0; --r)
    runnable.push_back(r);
  while (!runnable.empty()) {
    const int r = runnable.back();
    runnable.pop_back();
    const auto ur = static_cast<std::size_t>(r);
    const auto& list = s.ranks[ur];
    for (; pc[ur] < list.size(); ++pc[ur]) {
      const std::size_t i = pc[ur];
      const action& a = list[i];
      t.start[ur][i] = clock[ur];
      if (is_compute(a.kind)) {
        clock[ur] += duration(r, a);
      } else if (is_send(a.kind)) {
        const std::size_t tag = s.message_tag(r, a);
        sent[tag] = 1;
        arrival[tag] = clock[ur] + transit(a);
        if (waiter[tag] >= 0) {
          runnable.push_back(waiter[tag]);
          waiter[tag] = -1;
        }
      } else {
        const std::size_t tag = s.message_tag(r, a);
        if (!sent[tag]) {
          waiter[tag] = r;
          break;
        }
        clock[ur] = std::max(clock[ur], arrival[tag]);
      }
      t.end[ur][i] = clock[ur];
    }
  }
  std::string blocked;
  int first = -1;
  for (std::size_t r = 0; r < p; ++r) {
    if (pc[r] == s.ranks[r].size()) continue;
    const action& a = s.ranks[r][pc[r]];
    if (first < 0) first = static_cast<int>(r);
    blocked += (blocked.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
               " waits at action " + std::to_string(pc[r]) + " (" + token(a) + ") for rank " +
               std::to_string(a.peer);
  }
  if (first >= 0) {
    throw error(operation, first, error::unknown,
                "the step deadlocks: every unfinished rank waits for a message that is sent "
                "only after its own wait: " +
                    blocked);
  }
  return t;
}

} // namespace detail

/// Throws weft::error naming the first offending action (rank, index, token) unless `s` is a
/// complete, deadlock-free pipeline step; see the header comment for what that means.
inline void validate(const schedule& s) {
  const std::string op = "validating schedule" + (s.name.empty() ? std::string() : " " + s.name);
  const auto fail = [&](const std::string& what) {
    throw error(op, error::unknown, error::unknown, what);
  };
  if (s.stages < 1) fail("stages must be at least 1, not " + std::to_string(s.stages));
  if (s.microbatches < 1)
    fail("microbatches must be at least 1, not " + std::to_string(s.microbatches));
  if (s.chunks < 1) fail("chunks must be at least 1, not " + std::to_string(s.chunks));
  if (static_cast<int>(s.ranks.size()) != s.stages) {
    fail("has action lists for " + std::to_string(s.ranks.size()) + " ranks but " +
         std::to_string(s.stages) + " stages");
  }

  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  const int last = s.virtual_stages() - 1;
  const auto m = static_cast<std::size_t>(s.microbatches);
  const auto pairs = m * static_cast<std::size_t>(s.chunks);

  // The first offending action so far: the lowest rank, then the lowest index.
  struct issue {
    int rank;
    std::size_t index;
    std::string what;
  };
  std::optional<issue> first;
  const auto note = [&](int r, std::size_t i, std::string what) {
    if (!first || r < first->rank || (r == first->rank && i < first->index))
      first = issue{r, i, std::move(what)};
  };
  const auto name = [](action_kind k, int mb, int c) { return token(action{k, mb, c}); };

  for (int r = 0; r < s.stages && !first; ++r) {
    const auto& list = s.ranks[static_cast<std::size_t>(r)];
    // Where each kind of action of each (microbatch, chunk) sits in the list; npos: nowhere yet.
    enum slot : std::size_t { f, b, w, send_act, recv_act, send_grad, recv_grad, slots };
    std::vector<std::size_t> at(pairs * slots, npos);
    const auto where = [&](int mb, int c, slot k) -> std::size_t& {
      return at[static_cast<std::size_t>(mb * s.chunks + c) * slots + k];
    };
    const auto seen = [&](slot k, int mb, int c) { return where(mb, c, k) != npos; };
    // The scan goes on past a fault: whatever it finds later sits at a later index, and the
    // checks after it need the whole list.
    for (std::size_t i = 0; i < list.size(); ++i) {
      const action& a = list[i];
      if (a.microbatch < 0 || a.microbatch >= s.microbatches) {
        note(r, i,
             "microbatch " + std::to_string(a.microbatch) + " is outside [0, " +
                 std::to_string(s.microbatches) + ")");
        continue;
      }
      if (a.chunk < 0 || a.chunk >= s.chunks) {
        note(r, i,
             "chunk " + std::to_string(a.chunk) + " is outside [0, " + std::to_string(s.chunks) +
                 ")");
        continue;
      }
      const int mb = a.microbatch;
      const int c = a.chunk;
      const int v = s.virtual_stage(r, c);
      const bool prev_here = v > 0 && s.rank_of(v - 1) == r;
      const bool next_here = v < last && s.rank_of(v + 1) == r;
      // Records where the action sits; a second one of the same is a fault.
      const auto once = [&](slot k, const char* verb) -> std::optional<std::string> {
        std::size_t& x = where(mb, c, k);
        if (x != npos)
          return std::string(verb) + " twice (first at action " + std::to_string(x) + ")";
        x = i;
        return std::nullopt;
      };
      // The first thing wrong with the action, if any.
      const auto problem = [&]() -> std::optional<std::string> {
        switch (a.kind) {
          case action_kind::forward:
            if (auto twice = once(f, "forwarded")) return twice;
            if (prev_here && !seen(f, mb, c - 1))
              return "runs before " + name(action_kind::forward, mb, c - 1) +
                     ", its input, on this rank";
            if (!prev_here && v > 0 && !seen(recv_act, mb, c))
              return "runs without first receiving its input from rank " +
                     std::to_string(s.rank_of(v - 1));
            return std::nullopt;
          case action_kind::backward:
            if (auto twice = once(b, "backwarded")) return twice;
            if (!seen(f, mb, c))
              return "runs before its forward " + name(action_kind::forward, mb, c);
            if (next_here && !seen(b, mb, c + 1)) {
              return "runs before " + name(action_kind::backward, mb, c + 1) +
                     ", whose input gradient it needs, on this rank";
            }
            if (!next_here && v < last && !seen(recv_grad, mb, c)) {
              return "runs without first receiving its output gradient from rank " +
                     std::to_string(s.rank_of(v + 1));
            }
            return std::nullopt;
          case action_kind::weight:
            if (!s.split_backward)
              return "a weight gradient in a schedule whose B is the whole backward";
            if (auto twice = once(w, "weight gradient computed")) return twice;
            if (!seen(b, mb, c))
              return "runs before its backward " + name(action_kind::backward, mb, c);
            return std::nullopt;
          case action_kind::send_activation:
          case action_kind::send_gradient: {
            const bool act = a.kind == action_kind::send_activation;
            const int to = act ? v + 1 : v - 1;
            if (auto twice = once(act ? send_act : send_grad, "sent")) return twice;
            if (to < 0 || to > last) {
              return act ? "the last virtual stage has no activation to send"
                         : "the first virtual stage has no input gradient to send";
            }
            if (s.rank_of(to) == r)
              return "its consumer runs on this rank: there is nothing to send";
            if (s.rank_of(to) != a.peer) {
              return "goes to rank " + std::to_string(a.peer) + ", but its consumer runs on rank " +
                     std::to_string(s.rank_of(to));
            }
            const action_kind producer = act ? action_kind::forward : action_kind::backward;
            if (!seen(act ? f : b, mb, c))
              return "sent before " + name(producer, mb, c) + " made it";
            return std::nullopt;
          }
          case action_kind::recv_activation:
          case action_kind::recv_gradient: {
            const bool act = a.kind == action_kind::recv_activation;
            const int from = act ? v - 1 : v + 1;
            if (auto twice = once(act ? recv_act : recv_grad, "received")) return twice;
            if (from < 0 || from > last) {
              return act ? "the first virtual stage receives no activation"
                         : "the last virtual stage receives no gradient";
            }
            if (s.rank_of(from) == r)
              return "its producer runs on this rank: there is nothing to receive";
            if (s.rank_of(from) != a.peer) {
              return "comes from rank " + std::to_string(a.peer) +
                     ", but its producer runs on rank " + std::to_string(s.rank_of(from));
            }
            const action_kind consumer = act ? action_kind::forward : action_kind::backward;
            if (seen(act ? f : b, mb, c)) {
              return "received after its consumer " + name(consumer, mb, c) + " ran (action " +
                     std::to_string(where(mb, c, act ? f : b)) + ")";
            }
            return std::nullopt;
          }
        }
        return std::nullopt;
      };
      if (auto why = problem()) note(r, i, std::move(*why));
    }
    // What never happened, named at the action that should have led to it.
    for (int mb = 0; mb < s.microbatches; ++mb) {
      for (int c = 0; c < s.chunks; ++c) {
        const int v = s.virtual_stage(r, c);
        const std::size_t fi = where(mb, c, f);
        const std::size_t bi = where(mb, c, b);
        const std::string fwd = name(action_kind::forward, mb, c);
        const std::string bwd = name(action_kind::backward, mb, c);
        if (fi == npos) {
          note(r, list.size(), fwd + " never runs");
          continue;
        }
        if (bi == npos) note(r, fi, "forwarded but never backwarded: no " + bwd);
        if (bi != npos && s.split_backward && where(mb, c, w) == npos)
          note(r, bi, "no weight gradient " + name(action_kind::weight, mb, c) + " follows");
        if (v < last && s.rank_of(v + 1) != r && where(mb, c, send_act) == npos)
          note(r, fi, "its output is never sent to rank " + std::to_string(s.rank_of(v + 1)));
        if (bi != npos && v > 0 && s.rank_of(v - 1) != r && where(mb, c, send_grad) == npos)
          note(r, bi,
               "its input gradient is never sent to rank " + std::to_string(s.rank_of(v - 1)));
      }
    }
  }
  if (!first) {
    // Every message is now sent once and received once; its two ends must agree on its size.
    std::vector<std::size_t> sent(2 * m * static_cast<std::size_t>(s.virtual_stages()), npos);
    std::vector<std::size_t> sent_by(sent.size(), 0);
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (!is_send(list[i].kind)) continue;
        const std::size_t tag = s.message_tag(r, list[i]);
        sent[tag] = list[i].bytes;
        sent_by[tag] = static_cast<std::size_t>(r);
      }
    }
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (!is_recv(list[i].kind)) continue;
        const std::size_t tag = s.message_tag(r, list[i]);
        if (sent[tag] != list[i].bytes) {
          note(r, i,
               "expects " + std::to_string(list[i].bytes) + " bytes, but rank " +
                   std::to_string(sent_by[tag]) + " sends " + std::to_string(sent[tag]));
        }
      }
    }
  }
  if (first) {
    const auto& list = s.ranks[static_cast<std::size_t>(first->rank)];
    const int peer = first->index < list.size() && !is_compute(list[first->index].kind)
                         ? list[first->index].peer
                         : error::unknown;
    const std::string which =
        first->index < list.size()
            ? "action " + std::to_string(first->index) + " (" + token(list[first->index]) + ")"
            : "end of its list";
    throw error(op, first->rank, peer, which + ": " + first->what);
  }
  detail::run(
      s, op, [](int, const action&) { return 1.0; }, [](const action&) { return 0.0; });
}

} // namespace weft::pipeline
