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
// A transport's hooks define every one of these, or the plan does not compile: a hook that is
// missing or misspelled is an error, not a silent no-op. A transport that cannot run a kind
// throws from its hook; one whose plan check already refuses the message kinds or the
// peer-access kinds derives from plan_hooks_without_messages or plan_hooks_without_peer_access,
// whose hooks for those kinds say that the check let one through. The hooks type is a template
// argument: no call through a pointer, nothing per step that a hand-written loop would not do.
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <cstddef>
#include <span>
#include <string>

namespace weft {

/// The base of a transport's hooks (run_plan calls the members the derived type defines).
struct plan_hooks {};

namespace detail {
[[noreturn]] WEFT_COLD inline void step_past_the_check(const step& s) {
  throw error("weft: internal error: the plan check let a " + std::string(name_of(s.kind)) +
              " step through to a transport that cannot run it");
}
} // namespace detail

/// For a transport whose plan check refuses send, recv and recv_reduce (peer access only).
struct plan_hooks_without_messages : plan_hooks {
  [[noreturn]] void send(std::size_t, const step& s) { detail::step_past_the_check(s); }
  [[noreturn]] void recv(std::size_t, const step& s) { detail::step_past_the_check(s); }
  [[noreturn]] void recv_reduce(std::size_t, const step& s) { detail::step_past_the_check(s); }
};

/// For a transport whose plan check refuses load, load_reduce and sync (messages only).
struct plan_hooks_without_peer_access : plan_hooks {
  [[noreturn]] void load(std::size_t, const step& s) { detail::step_past_the_check(s); }
  [[noreturn]] void load_reduce(std::size_t, const step& s) { detail::step_past_the_check(s); }
  [[noreturn]] void sync(std::size_t, const step& s) { detail::step_past_the_check(s); }
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
