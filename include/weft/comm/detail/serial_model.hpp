#pragma once
// Runs the plans of every rank of one call in a single thread, on the execution model that
// plan.hpp defines, and checks them while it does: buffer bounds, message sizes, a send whose
// source changes before its receiver has consumed it, and deadlock. Tests use it to check an
// algorithm's plans without threads; a seed varies the order in which ranks advance, so a
// plan that only works under one interleaving is caught.
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace weft::detail {

template <class T>
struct model_rank {
  std::vector<T> input;
  std::vector<T> output;
  bool in_place = false; // input aliases output (input is then ignored)
  std::vector<T> scratch;
};

template <class T, class Op>
void run_serial(const std::vector<plan>& plans, std::vector<model_rank<T>>& ranks, const Op& op,
                std::uint64_t seed = 0) {
  const int p = static_cast<int>(plans.size());
  WEFT_EXPECTS(static_cast<int>(ranks.size()) == p, "run_serial: one buffer set per plan");
  struct message {
    int src_rank;
    std::size_t step_index;
    std::vector<T> snapshot;
    bool consumed = false;
  };
  struct rank_state {
    plan_cursor at;                                  // where the rank is in its plan
    bool arrived = false;                            // arrived at the current sync
    std::vector<message*> sent;                      // this round's messages
    std::map<std::vector<int>, std::uint64_t> syncs; // syncs passed per group
  };
  std::map<std::pair<int, int>, std::deque<message>> channels; // (src, dst) -> FIFO
  std::map<std::vector<int>, std::map<std::uint64_t, int>> arrivals;
  std::vector<rank_state> st(static_cast<std::size_t>(p));

  for (int r = 0; r < p; ++r) {
    ranks[static_cast<std::size_t>(r)].scratch.assign(
        plans[static_cast<std::size_t>(r)].scratch_count(), T{});
    st[static_cast<std::size_t>(r)].at = plan_cursor(plans[static_cast<std::size_t>(r)].steps());
  }
  const auto where = [&](int r, std::size_t i) {
    return "rank " + std::to_string(r) + " step " + std::to_string(i) + " of\n" +
           plans[static_cast<std::size_t>(r)].to_string();
  };
  const auto span_of = [&](int r, buffer b, std::size_t off, std::size_t n, std::size_t i) -> T* {
    auto& rk = ranks[static_cast<std::size_t>(r)];
    std::vector<T>& v = b == buffer::scratch
                            ? rk.scratch
                            : (b == buffer::input && !rk.in_place ? rk.input : rk.output);
    if (!step_range_fits(off, n, v.size())) {
      throw error("serial model: range [" + std::to_string(off) + ", +" + std::to_string(n) +
                  ") outside buffer of " + std::to_string(v.size()) + " elements at " +
                  where(r, i));
    }
    return v.data() + off;
  };

  std::mt19937_64 rng(seed);
  std::vector<int> order(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    order[static_cast<std::size_t>(i)] = i;

  // Advances rank r by at most one step; returns whether it made progress.
  const auto advance = [&](int r) -> bool {
    const plan& pl = plans[static_cast<std::size_t>(r)];
    rank_state& s = st[static_cast<std::size_t>(r)];
    const auto& steps = pl.steps();
    if (s.at.finished()) return false;
    if (!s.at.is_open()) {
      const plan_round round = s.at.open();
      for (std::size_t i = round.begin; i < round.end; ++i) {
        const step& x = steps[i];
        if (x.kind != step_kind::send) continue;
        if (x.peer < 0 || x.peer >= p || x.peer == r)
          throw error("serial model: bad send peer at " + where(r, i));
        const T* src = span_of(r, x.src, x.src_offset, x.count, i);
        auto& q = channels[{r, x.peer}];
        q.push_back(message{r, i, std::vector<T>(src, src + x.count)});
        s.sent.push_back(&q.back());
      }
      return true;
    }
    const step* const at = s.at.current();
    if (at == nullptr) {
      // End of round: every send consumed, and its source unchanged until then.
      for (message* m : s.sent) {
        if (!m->consumed) return false;
      }
      s.sent.clear();
      s.at.close();
      return true;
    }
    const std::size_t i = s.at.index();
    const step& x = *at;
    switch (x.kind) {
      case step_kind::recv:
      case step_kind::recv_reduce: {
        if (x.peer < 0 || x.peer >= p || x.peer == r)
          throw error("serial model: bad recv peer at " + where(r, i));
        auto& q = channels[{x.peer, r}];
        message* m = nullptr;
        for (auto& cand : q) {
          if (!cand.consumed) {
            m = &cand;
            break;
          }
        }
        if (m == nullptr) return false;
        if (m->snapshot.size() != x.count) {
          throw error("serial model: rank " + std::to_string(r) + " receives " +
                      std::to_string(x.count) + " elements but rank " + std::to_string(x.peer) +
                      " sent " + std::to_string(m->snapshot.size()) + " at " + where(r, i));
        }
        const step& sx = plans[static_cast<std::size_t>(x.peer)].steps()[m->step_index];
        const T* live = span_of(x.peer, sx.src, sx.src_offset, sx.count, m->step_index);
        for (std::size_t k = 0; k < x.count; ++k) {
          if (std::memcmp(&live[k], &m->snapshot[k], sizeof(T)) != 0) {
            throw error("serial model: rank " + std::to_string(x.peer) +
                        " changed the source of a send before rank " + std::to_string(r) +
                        " consumed it, at " + where(x.peer, m->step_index));
          }
        }
        T* dst = span_of(r, x.dst, x.dst_offset, x.count, i);
        if (x.kind == step_kind::recv) {
          copy_n(dst, m->snapshot.data(), x.count);
        } else {
          const T* a = span_of(r, x.src, x.src_offset, x.count, i);
          reduce2(dst, a, m->snapshot.data(), x.count, op);
        }
        m->consumed = true;
        while (!q.empty() && q.front().consumed) {
          // messages are referenced by their senders until their round ends
          bool referenced = false;
          for (auto& other : st) {
            for (message* sm : other.sent)
              referenced = referenced || sm == &q.front();
          }
          if (referenced) break;
          q.pop_front();
        }
        break;
      }
      case step_kind::copy:
      case step_kind::reduce: {
        const T* a = span_of(r, x.src, x.src_offset, x.count, i);
        T* d = span_of(r, x.dst, x.dst_offset, x.count, i);
        if (x.kind == step_kind::copy) {
          copy_n(d, a, x.count);
        } else {
          reduce2(d, d, a, x.count, op);
        }
        break;
      }
      case step_kind::load: {
        if (x.peer < 0 || x.peer >= p) throw error("serial model: bad load peer at " + where(r, i));
        const T* a = span_of(x.peer, x.src, x.src_offset, x.count, i);
        T* d = span_of(r, x.dst, x.dst_offset, x.count, i);
        copy_n(d, a, x.count);
        break;
      }
      case step_kind::load_reduce: {
        const auto& g = pl.group(x.peer);
        std::vector<const T*> srcs;
        for (int q : g)
          srcs.push_back(span_of(q, x.src, x.src_offset, x.count, i));
        T* d = span_of(r, x.dst, x.dst_offset, x.count, i);
        // Through a temporary: the model must not depend on how sources alias the destination.
        std::vector<T> tmp(x.count);
        reduce_many(tmp.data(), srcs.data(), srcs.size(), x.count, op);
        copy_n(d, tmp.data(), x.count);
        break;
      }
      case step_kind::sync: {
        const auto& g = pl.group(x.peer);
        std::uint64_t& gen = s.syncs[g];
        auto& arrived = arrivals[g][gen];
        // Arrive once, then wait until every member has arrived at this generation.
        if (!s.arrived) {
          ++arrived;
          s.arrived = true;
        }
        if (arrived < static_cast<int>(g.size())) return false;
        s.arrived = false;
        ++gen;
        break;
      }
      case step_kind::send: break;
    }
    s.at.next();
    return true;
  };

  for (;;) {
    bool all_done = true;
    bool progress = false;
    if (seed != 0) std::shuffle(order.begin(), order.end(), rng);
    for (int r : order) {
      const auto& s = st[static_cast<std::size_t>(r)];
      if (!s.at.finished()) {
        all_done = false;
        // Seeded runs advance a random number of steps, to vary the interleaving.
        const int burst = seed != 0 ? 1 + static_cast<int>(rng() % 3) : 1 << 30;
        for (int k = 0; k < burst && advance(r); ++k)
          progress = true;
      }
    }
    if (all_done) break;
    if (!progress) {
      std::string msg = "serial model: deadlock; blocked at:";
      for (int r = 0; r < p; ++r) {
        const auto& s = st[static_cast<std::size_t>(r)];
        const auto& steps = plans[static_cast<std::size_t>(r)].steps();
        if (!s.at.finished()) {
          std::size_t i = s.at.index() < steps.size() ? s.at.index() : steps.size() - 1;
          msg += "\n  rank " + std::to_string(r) + " step " + std::to_string(i) + " (" +
                 std::string(name_of(steps[i].kind)) + " peer " + std::to_string(steps[i].peer) +
                 ", round " + std::to_string(steps[i].round) + ")";
        }
      }
      throw error(msg);
    }
  }
  for (auto& [key, q] : channels) {
    for (auto& m : q) {
      if (!m.consumed) {
        throw error("serial model: a message from rank " + std::to_string(key.first) + " to rank " +
                    std::to_string(key.second) + " was never received");
      }
    }
  }
}

} // namespace weft::detail
