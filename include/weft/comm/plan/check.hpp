#pragma once
// The one check of a plan against the rank that runs it, before any step runs: the plan is
// this rank's, every peer and group member a rank of the communicator, every group index a
// group of the plan, and (where the transport knows its buffers up front) every range of the
// rank's own buffers inside them. A transport states which step kinds it runs and adds its
// own rules through hooks (a type whose members check_plan_steps calls; plan_check_hooks gives
// refuse a weft::error naming the step's kind, and the others a no-op):
//
//   refuse(s)              a step of a kind the transport does not run: throws
//   member(pl, g, i)       after member i of group g is found a rank
//   reduces_over(pl, g)    a load_reduce over group g, after the group is checked
//   load_from(q, b, o, n)  a load of elements [o, o + n) of rank q's buffer b (q may be this
//                          rank), before this rank's own range is checked where q is it
#include <weft/comm/detail/argument_checks.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace weft {

/// Throws weft::error unless `pl` is the plan of rank `rank` of `size`.
inline void check_plan_rank(const plan& pl, int rank, int size, std::string_view operation) {
  if (pl.size() != size || pl.rank() != rank) {
    throw error(operation, rank, error::unknown,
                "the plan is for rank " + std::to_string(pl.rank()) + " of " +
                    std::to_string(pl.size()) + ", not rank " + std::to_string(rank) + " of " +
                    std::to_string(size));
  }
}

/// Throws weft::error unless `peer` is a rank of a communicator of `size` (and, unless
/// self_allowed, another one than `rank`).
inline void check_peer_rank(int peer, int rank, int size, bool self_allowed,
                            std::string_view operation) {
  if (peer < 0 || peer >= size || (!self_allowed && peer == rank)) {
    throw error(operation, rank, peer,
                "peer outside the communicator of " + std::to_string(size) + " ranks");
  }
}

[[deprecated("use check_peer_rank")]] inline void check_plan_peer(int peer, int rank, int size,
                                                                  bool self_allowed,
                                                                  std::string_view operation) {
  check_peer_rank(peer, rank, size, self_allowed, operation);
}

/// Throws weft::error unless elements [offset, offset + count) of a peer's buffer of `size`
/// elements, which `what` names ("a peer buffer"), lie inside it: a load's range, checked
/// where the peer's buffers are known.
inline void check_peer_range(std::size_t offset, std::size_t count, std::size_t size,
                             std::string_view what, std::string_view operation, int rank,
                             int peer) {
  if (!step_range_fits(offset, count, size)) {
    throw error(operation, rank, peer,
                "plan loads elements [" + std::to_string(offset) + ", " +
                    std::to_string(offset + count) + ") of " + std::string(what) + " of " +
                    std::to_string(size));
  }
}

/// Throws weft::error unless a staged plan's load reads its peer's staging area
/// (`reads_staging`: the load's buffer is scratch, and where the transport checks it here,
/// its range lies in the staging area), the only memory a staged plan's peers keep for it.
inline void check_staged_load(bool reads_staging, std::string_view operation, int rank, int peer) {
  if (!reads_staging) {
    throw error(operation, rank, peer, "a staged plan may load only from its peers' staging area");
  }
}

/// Whether a plan runs in place: its input and output one buffer (in_bytes != 0 and in == out).
/// Throws weft::error when they overlap without being the same buffer: the device transports
/// place a round's receives by buffer and offset, which is exact for one buffer or two apart.
inline bool plan_runs_in_place(const void* in, std::size_t in_bytes, const void* out,
                               std::size_t out_bytes, std::string_view operation, int rank) {
  if (in_bytes != 0 && in == out) return true;
  if (detail::overlap(in, in_bytes, out, out_bytes)) {
    throw error(operation, rank, error::unknown,
                "input and output overlap without being the same buffer (in place: pass one "
                "buffer as both)");
  }
  return false;
}

/// Who runs a plan, and what of it check_plan_steps checks.
struct plan_check {
  int rank = 0;
  int size = 1;
  std::string_view operation;
  const std::size_t* sizes = nullptr; // the own buffers' elements (input, output, scratch);
                                      // nullptr: their ranges are checked as the steps run
  bool messages = true;               // runs send, recv, recv_reduce (else refuse())
  bool peer_access = true;            // runs load, load_reduce, sync (else refuse())
};

namespace detail {
// The two families of kinds a transport may not run (plan_check::messages, ::peer_access).
constexpr bool is_message_step(step_kind k) noexcept {
  return k == step_kind::send || k == step_kind::recv || k == step_kind::recv_reduce;
}
constexpr bool is_peer_access_step(step_kind k) noexcept {
  return k == step_kind::load || k == step_kind::load_reduce || k == step_kind::sync;
}

[[noreturn]] WEFT_COLD inline void refuse_step(const step& s) {
  throw error("weft: the plan has a " + std::string(name_of(s.kind)) +
              " step, and this transport runs no " +
              (is_message_step(s.kind) ? "message" : "peer-access") + " steps");
}
} // namespace detail

/// The default hooks: refuse throws weft::error naming the step's kind; the others do
/// nothing. A transport's hooks derive from this and hide what they add.
struct plan_check_hooks {
  [[noreturn]] void refuse(const step& s) { detail::refuse_step(s); }
  void member(const plan&, int, std::size_t) {}
  void reduces_over(const plan&, int) {}
  void load_from(int, buffer, std::size_t, std::size_t) {}
};

/// Checks every step of `pl` in order (see the top of this header).
template <class Hooks>
void check_plan_steps(const plan& pl, const plan_check& c, Hooks& x) {
  const auto own = [&](buffer b, std::size_t offset, std::size_t count) {
    if (c.sizes != nullptr)
      check_step_range(offset, count, c.sizes[static_cast<std::size_t>(b)], c.operation, c.rank);
  };
  const auto peer = [&](int q, bool self_allowed) {
    check_peer_rank(q, c.rank, c.size, self_allowed, c.operation);
  };
  const auto group = [&](int g) {
    if (g < 0 || static_cast<std::size_t>(g) >= pl.groups().size()) {
      throw error(c.operation, c.rank, error::unknown,
                  "plan step names group " + std::to_string(g) + " of " +
                      std::to_string(pl.groups().size()));
    }
    const auto& members = pl.group(g);
    for (std::size_t i = 0; i < members.size(); ++i) {
      peer(members[i], true);
      x.member(pl, g, i);
    }
  };
  const auto load = [&](int q, const step& s) {
    x.load_from(q, s.src, s.src_offset, s.count);
    if (q == c.rank) own(s.src, s.src_offset, s.count);
  };
  for (const step& s : pl.steps()) {
    if ((detail::is_message_step(s.kind) && !c.messages) ||
        (detail::is_peer_access_step(s.kind) && !c.peer_access))
      x.refuse(s);
    switch (s.kind) {
      case step_kind::send:
        peer(s.peer, false);
        own(s.src, s.src_offset, s.count);
        break;
      case step_kind::recv:
        peer(s.peer, false);
        own(s.dst, s.dst_offset, s.count);
        break;
      case step_kind::recv_reduce:
        peer(s.peer, false);
        own(s.src, s.src_offset, s.count);
        own(s.dst, s.dst_offset, s.count);
        break;
      case step_kind::copy:
      case step_kind::reduce:
        own(s.src, s.src_offset, s.count);
        own(s.dst, s.dst_offset, s.count);
        break;
      case step_kind::load:
        peer(s.peer, true);
        load(s.peer, s);
        own(s.dst, s.dst_offset, s.count);
        break;
      case step_kind::load_reduce:
        group(s.peer);
        x.reduces_over(pl, s.peer);
        for (int q : pl.group(s.peer))
          load(q, s);
        own(s.dst, s.dst_offset, s.count);
        break;
      case step_kind::sync: group(s.peer); break;
    }
  }
}

} // namespace weft
