#pragma once
// The one walk of a plan that every transport runs (plan.hpp's execution model): round by
// round, the round's sends first, then its other steps in order, then the round's end. A
// transport supplies only hooks, a type whose members run_plan calls:
//
//   begin_round(r)       before the round's sends (a device transport places its receives)
//   at_step(r, k, s)     before every step, sends included (progress records)
//   send(k, s)           each send of the round, in order
//   sends_posted(r)      after the round's sends (receives that pair with them go here)
//   recv, recv_reduce, copy, reduce, load, load_reduce, sync (k, s)
//                        the round's other steps, in order
//   end_round(r)         once the round's steps are run (wait for its messages)
//
// plan_hooks gives every member a no-op; a transport's hooks derive from it and hide the
// members they run. A transport that cannot run a kind throws from that kind's hook. The
// hooks type is a template argument: no call through a pointer, nothing per step that a
// hand-written loop would not do.
#include <weft/comm/plan.hpp>

#include <cstddef>
#include <span>

namespace weft {

/// No-op hooks; a transport's hooks derive from this and hide what they run.
struct plan_hooks {
  void begin_round(const plan_round&) {}
  void at_step(const plan_round&, std::size_t, const step&) {}
  void send(std::size_t, const step&) {}
  void sends_posted(const plan_round&) {}
  void recv(std::size_t, const step&) {}
  void recv_reduce(std::size_t, const step&) {}
  void copy(std::size_t, const step&) {}
  void reduce(std::size_t, const step&) {}
  void load(std::size_t, const step&) {}
  void load_reduce(std::size_t, const step&) {}
  void sync(std::size_t, const step&) {}
  void end_round(const plan_round&) {}
};

/// Runs `steps` through the hooks `x`, round by round (see the top of this header).
template <class Hooks>
void run_plan(std::span<const step> steps, Hooks& x) {
  for (const plan_round& r : rounds_of(steps)) {
    x.begin_round(r);
    for (std::size_t k = r.begin; k < r.end; ++k) {
      const step& s = steps[k];
      if (s.kind != step_kind::send) continue;
      x.at_step(r, k, s);
      x.send(k, s);
    }
    x.sends_posted(r);
    for (std::size_t k = r.begin; k < r.end; ++k) {
      const step& s = steps[k];
      if (s.kind == step_kind::send) continue;
      x.at_step(r, k, s);
      switch (s.kind) {
        case step_kind::send: break;
        case step_kind::recv: x.recv(k, s); break;
        case step_kind::recv_reduce: x.recv_reduce(k, s); break;
        case step_kind::copy: x.copy(k, s); break;
        case step_kind::reduce: x.reduce(k, s); break;
        case step_kind::load: x.load(k, s); break;
        case step_kind::load_reduce: x.load_reduce(k, s); break;
        case step_kind::sync: x.sync(k, s); break;
      }
    }
    x.end_round(r);
  }
}

} // namespace weft
