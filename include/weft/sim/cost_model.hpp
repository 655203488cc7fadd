#pragma once
// The alpha-beta cost model: runs every rank's plan of one call over a cluster model with a
// clock per rank instead of data, and returns the predicted time of the call. It follows the
// execution model of plan.hpp step for step, so it prices exactly the schedule a transport
// runs (Hockney's model, "The communication challenge for MPP: Intel Paragon and Meiko
// CS-2", Parallel Computing 20(3), 1994: a message of n bytes costs alpha + n / beta).
//
//   round of rank r, starting at its clock t0:
//     sends       all posted at t0; they share r's link, so the k-th is ready at
//                 t0 + (bytes of the sends before it) / bandwidth
//     recv        starts when the sender's message is ready and r has reached the step;
//                 lasts latency + bytes / bandwidth of the link between the two devices
//     reduce      recv_reduce, reduce and copy add bytes / reduce_bandwidth of local work
//     load        latency + bytes / bandwidth from the peer's device; load_reduce loads
//                 from every member in turn, then reduces (k - 1 passes); a load from
//                 another node queues on that node's NICs like a message
//     sync        waits for every member to arrive, plus one latency
//     end         when the round's steps are done and its sends have been received
//
//   shared NICs: a message that leaves its node also queues on the node's NICs, one pipe of
//                nics * inter bandwidth shared by all its ranks, in the order the transfers
//                start; each transfer still gets at most one NIC's worth. (local::options::
//                emulate_links paces real transfers by these same rules.)
//
// Matching of messages (FIFO per pair of ranks) and of syncs (the k-th sync over the same
// ranks) is the serial model's. The simulation always advances the rank with the earliest
// clock (ties: the lower rank) by one step, so transfers take the NIC pipes in time order; it
// is deterministic, and the work is O(steps log ranks) (sync groups count once per member).
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::sim {

/// What one call costs, and where its bytes went.
struct breakdown {
  double total = 0;           // seconds until the last rank finishes
  std::vector<double> finish; // seconds until rank r finishes
  double intra_bytes = 0;     // bytes over intra-node links (messages and loads)
  double inter_bytes = 0;     // bytes over inter-node links
};

/// Simulates plans[r] on rank r, which runs on device device_of[r] of `c` (device r when
/// device_of is empty), for elements of element_size bytes. Throws weft::error on a peer or
/// device out of range, a deadlock, or a message nobody receives.
WEFT_COLD inline breakdown simulate(const std::vector<plan>& plans, const topology::cluster& c,
                          const std::vector<int>& device_of, std::size_t element_size) {
  const int p = static_cast<int>(plans.size());
  const auto up = plans.size();
  breakdown out;
  out.finish.assign(up, 0.0);
  if (p == 0) return out;
  if (!device_of.empty() && device_of.size() != up) {
    throw error("weft: cost model: device_of names " + std::to_string(device_of.size()) +
                " devices for " + std::to_string(p) + " ranks");
  }
  if (device_of.empty() && p > c.size()) {
    throw error("weft: cost model: " + std::to_string(p) + " ranks on a cluster of " +
                std::to_string(c.size()) + " devices; give device_of to place them");
  }
  std::vector<int> dev(up);
  std::vector<int> node(up);
  for (std::size_t r = 0; r < up; ++r) {
    dev[r] = device_of.empty() ? static_cast<int>(r) : device_of[r];
    if (dev[r] < 0 || dev[r] >= c.size()) {
      throw error("weft: cost model: rank " + std::to_string(r) + " on device " +
                  std::to_string(dev[r]) + ", outside a cluster of " + std::to_string(c.size()));
    }
    node[r] = c.node_of(dev[r]);
  }
  const double es = static_cast<double>(element_size);
  const double reduce_bw = c.reduce_bandwidth();
  const auto bad_peer = [&](int r, const step& x) {
    return error("weft: cost model: rank " + std::to_string(r) + " " +
                 std::string(name_of(x.kind)) + " with peer " + std::to_string(x.peer) +
                 " in a group of " + std::to_string(p));
  };
  const auto rank_ok = [&](int q) { return q >= 0 && q < p; };

  // When each node's NIC pipe is next free: messages leaving the node queue on it.
  std::vector<double> nic_free(static_cast<std::size_t>(c.nodes()), 0.0);
  const double nic_pipe = static_cast<double>(c.nics_per_node()) * c.inter().bandwidth;

  // Sync groups, interned by their members so that plans built apart still match.
  std::map<std::vector<int>, int> group_ids;
  std::vector<const std::vector<int>*> group_members;
  std::vector<std::vector<int>> plan_groups(up); // plan's group index -> interned id
  for (std::size_t r = 0; r < up; ++r) {
    for (const auto& g : plans[r].groups()) {
      auto [it, fresh] = group_ids.try_emplace(g, static_cast<int>(group_members.size()));
      if (fresh) group_members.push_back(&it->first);
      plan_groups[r].push_back(it->second);
    }
  }

  struct message {
    double ready;    // when the sender's link can start it
    double duration; // latency + bytes / bandwidth
    double bytes;
    int from_node;   // the sender's node, when the message leaves it; -1 otherwise
    double end = 0;
    bool consumed = false;
  };
  struct channel {
    std::vector<message> messages;
    std::size_t next = 0; // the next message the receiver takes
  };
  struct sync_instance {
    int arrived = 0;
    double latest = 0;
    double release = 0;
  };
  struct rank_state {
    std::size_t pc = 0;
    std::uint32_t round = 0;
    bool posted = false;
    bool arrived = false; // arrived at the sync at pc
    bool blocked = false;
    double clock = 0;
    std::vector<std::pair<std::uint64_t, std::size_t>> sent; // (channel, message) of this round
    std::unordered_map<int, std::uint64_t> sync_generation;
  };
  std::unordered_map<std::uint64_t, channel> channels;
  const auto channel_key = [&](int src, int dst) {
    return static_cast<std::uint64_t>(src) * static_cast<std::uint64_t>(p) +
           static_cast<std::uint64_t>(dst);
  };
  std::map<std::pair<int, std::uint64_t>, sync_instance> syncs;
  std::vector<rank_state> st(up);
  // Runnable ranks, earliest clock first (then lowest rank).
  using entry = std::pair<double, int>;
  std::priority_queue<entry, std::vector<entry>, std::greater<>> ready;
  for (int r = 0; r < p; ++r)
    ready.emplace(0.0, r);
  const auto wake = [&](int q) {
    auto& s = st[static_cast<std::size_t>(q)];
    if (s.blocked) {
      s.blocked = false;
      ready.emplace(s.clock, q);
    }
  };
  const auto count_bytes = [&](int a, int b, double bytes) {
    (node[static_cast<std::size_t>(a)] == node[static_cast<std::size_t>(b)] ? out.intra_bytes
                                                                            : out.inter_bytes) +=
        bytes;
  };
  const auto link_of = [&](int a, int b) -> const topology::link& {
    return c.link_between(dev[static_cast<std::size_t>(a)], dev[static_cast<std::size_t>(b)]);
  };

  // Rank r reads `bytes` of rank q's memory from time t: when the bytes are in (without the
  // latency). A read from another node queues on that node's NICs, as a message would.
  const auto pull = [&](int q, int r, double t, double bytes) {
    const topology::link& l = link_of(r, q);
    double end = t + bytes / l.bandwidth;
    if (node[static_cast<std::size_t>(q)] != node[static_cast<std::size_t>(r)]) {
      double& pipe = nic_free[static_cast<std::size_t>(node[static_cast<std::size_t>(q)])];
      pipe = std::max(pipe, t) + bytes / nic_pipe;
      end = std::max(end, pipe);
    }
    return end;
  };

  // Runs rank r until it blocks or finishes.
  const auto advance = [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    const plan& pl = plans[ur];
    const auto& steps = pl.steps();
    rank_state& s = st[ur];
    for (;;) {
      if (!s.posted) {
        if (s.pc >= steps.size()) return;
        const std::uint32_t round = s.round = steps[s.pc].round;
        double busy = 0; // the sends of one round share the rank's link, one after another
        for (std::size_t i = s.pc; i < steps.size() && steps[i].round == round; ++i) {
          const step& x = steps[i];
          if (x.kind != step_kind::send) continue;
          if (!rank_ok(x.peer) || x.peer == r) throw bad_peer(r, x);
          const double bytes = static_cast<double>(x.count) * es;
          const topology::link& l = link_of(r, x.peer);
          const bool leaves = node[ur] != node[static_cast<std::size_t>(x.peer)];
          const std::uint64_t key = channel_key(r, x.peer);
          channel& ch = channels[key];
          ch.messages.push_back(
              message{s.clock + busy, l.latency + bytes / l.bandwidth, bytes, leaves ? node[ur] : -1});
          busy += bytes / l.bandwidth;
          s.sent.emplace_back(key, ch.messages.size() - 1);
          count_bytes(r, x.peer, bytes);
          wake(x.peer);
        }
        s.posted = true;
      }
      const std::uint32_t round = s.round;
      while (s.pc < steps.size() && steps[s.pc].round == round &&
             steps[s.pc].kind == step_kind::send)
        ++s.pc;
      if (s.pc >= steps.size() || steps[s.pc].round != round) {
        for (const auto& [key, idx] : s.sent) {
          const message& m = channels[key].messages[idx];
          if (!m.consumed) {
            s.blocked = true;
            return;
          }
          s.clock = std::max(s.clock, m.end);
        }
        s.sent.clear();
        s.posted = false;
        continue;
      }
      const step& x = steps[s.pc];
      const double bytes = static_cast<double>(x.count) * es;
      switch (x.kind) {
        case step_kind::recv:
        case step_kind::recv_reduce: {
          if (!rank_ok(x.peer) || x.peer == r) throw bad_peer(r, x);
          channel& ch = channels[channel_key(x.peer, r)];
          if (ch.next >= ch.messages.size()) {
            s.blocked = true;
            return;
          }
          message& m = ch.messages[ch.next++];
          const double start = std::max(s.clock, m.ready);
          m.end = start + m.duration;
          if (m.from_node >= 0) {
            double& pipe = nic_free[static_cast<std::size_t>(m.from_node)];
            pipe = std::max(pipe, start) + m.bytes / nic_pipe;
            m.end = std::max(m.end, pipe + c.inter().latency);
          }
          m.consumed = true;
          s.clock = m.end;
          if (x.kind == step_kind::recv_reduce) s.clock += bytes / reduce_bw;
          wake(x.peer);
          break;
        }
        case step_kind::copy:
        case step_kind::reduce: s.clock += bytes / reduce_bw; break;
        case step_kind::load: {
          if (!rank_ok(x.peer)) throw bad_peer(r, x);
          const topology::link& l = link_of(r, x.peer);
          s.clock = pull(x.peer, r, s.clock, bytes) + l.latency;
          count_bytes(r, x.peer, bytes);
          break;
        }
        case step_kind::load_reduce: {
          const auto& g = pl.group(x.peer);
          double latency = 0;
          for (int q : g) {
            if (!rank_ok(q)) throw bad_peer(r, x);
            latency = std::max(latency, link_of(r, q).latency);
            s.clock = pull(q, r, s.clock, bytes);
            count_bytes(r, q, bytes);
          }
          s.clock += latency;
          if (g.size() > 1) s.clock += static_cast<double>(g.size() - 1) * bytes / reduce_bw;
          break;
        }
        case step_kind::sync: {
          const int gid = plan_groups[ur].at(static_cast<std::size_t>(x.peer));
          const auto& members = *group_members[static_cast<std::size_t>(gid)];
          const std::uint64_t gen = s.sync_generation[gid];
          sync_instance& si = syncs[{gid, gen}];
          if (!s.arrived) {
            s.arrived = true;
            si.latest = std::max(si.latest, s.clock);
            if (++si.arrived == static_cast<int>(members.size())) {
              bool one_node = true;
              for (int q : members) {
                if (!rank_ok(q)) throw bad_peer(r, x);
                one_node = one_node && node[static_cast<std::size_t>(q)] == node[ur];
              }
              si.release = si.latest + (one_node ? c.intra().latency
                                                 : std::max(c.intra().latency, c.inter().latency));
              for (int q : members) {
                if (q != r) wake(q);
              }
            }
          }
          if (si.arrived < static_cast<int>(members.size())) {
            s.blocked = true;
            return;
          }
          s.arrived = false;
          ++s.sync_generation[gid];
          s.clock = si.release;
          break;
        }
        case step_kind::send: break;
      }
      ++s.pc;
      if (!ready.empty() && ready.top() < entry{s.clock, r}) {  // someone is earlier: let them go first
        ready.emplace(s.clock, r);
        return;
      }
    }
  };

  while (!ready.empty()) {
    const int r = ready.top().second;
    ready.pop();
    advance(r);
  }

  std::string stuck;
  for (int r = 0; r < p; ++r) {
    const auto& s = st[static_cast<std::size_t>(r)];
    const auto& steps = plans[static_cast<std::size_t>(r)].steps();
    if (s.pc < steps.size() || s.posted) {
      const std::size_t i = std::min(s.pc, steps.size() - 1);
      stuck += "\n  rank " + std::to_string(r) + " step " + std::to_string(i) + " (" +
               std::string(name_of(steps[i].kind)) + " peer " + std::to_string(steps[i].peer) +
               ", round " + std::to_string(steps[i].round) + ")";
    }
    out.finish[static_cast<std::size_t>(r)] = s.clock;
    out.total = std::max(out.total, s.clock);
  }
  if (!stuck.empty()) throw error("weft: cost model: the plans deadlock; blocked at:" + stuck);
  for (const auto& [key, ch] : channels) {
    if (ch.next < ch.messages.size()) {
      throw error("weft: cost model: a message from rank " +
                  std::to_string(key / static_cast<std::uint64_t>(p)) + " to rank " +
                  std::to_string(key % static_cast<std::uint64_t>(p)) + " is never received");
    }
  }
  return out;
}

/// Predicted seconds for one call: the time the slowest rank finishes.
inline double price(const std::vector<plan>& plans, const topology::cluster& c,
                    const std::vector<int>& device_of, std::size_t element_size) {
  return simulate(plans, c, device_of, element_size).total;
}

/// The plans of every rank of q's group (q.rank is ignored).
inline std::vector<plan> plans_of(plan (*make_plan)(const plan_request&), plan_request q) {
  std::vector<plan> plans;
  plans.reserve(static_cast<std::size_t>(q.size > 0 ? q.size : 0));
  for (int r = 0; r < q.size; ++r) {
    q.rank = r;
    plans.push_back(make_plan(q));
  }
  return plans;
}

/// Predicted seconds for one call of q planned by algorithm A.
template <algo::plan_generator A>
double price(const plan_request& q, const topology::cluster& c,
             const std::vector<int>& device_of = {}) {
  return price(plans_of(&A::make_plan, q), c, device_of, q.element_size);
}

} // namespace weft::sim

#include <weft/core/detail/planning_end.hpp>
