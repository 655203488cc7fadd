#pragma once
// The alpha-beta cost model: runs every rank's plan of one call over a cluster model with a
// clock per rank instead of data, and returns the predicted time of the call. It follows the
// execution model of plan.hpp step for step, so it prices exactly the schedule a transport
// runs (Hockney's model, "The communication challenge for MPP: Intel Paragon and Meiko
// CS-2", Parallel Computing 20(3), 1994: a message of n bytes costs alpha + n / beta).
//
//   round of rank r, starting at its clock t0:
//     sends       all posted at t0; they take r's link one after another
//     recv        starts when the sender's message is ready and r has reached the step
//     reduce      recv_reduce, reduce and copy add bytes / reduce_bandwidth of local work
//     load        load_reduce loads from every member in turn, then reduces (k - 1 passes)
//     sync        waits for every member to arrive
//     end         when the round's steps are done and its sends have been received
//
// What a send, receive, load and sync cost, and how a node's ranks share its NICs, are the
// link rules of comm/detail/link_rules.hpp, by which local::options::emulate_links paces real
// transfers too.
//
// Matching of messages (FIFO per pair of ranks) and of syncs (the k-th sync over the same
// ranks) is the serial model's. The simulation always advances the rank with the earliest
// clock (ties: the lower rank) by one step, so transfers take the NIC pipes in time order; it
// is deterministic, and the work is O(steps log ranks) (sync groups count once per member).
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/detail/link_rules.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::cost_model {

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

  namespace rules = detail::link_rules;
  using clock = rules::seconds_clock;
  // When each node's NIC pipe is next free: messages leaving the node queue on it.
  std::vector<double> nic_free(static_cast<std::size_t>(c.nodes()), 0.0);
  const auto nic_of = [&nic_free](int n) {
    return [&nic_free, n](double t, double seconds) {
      return rules::take<clock>(nic_free[static_cast<std::size_t>(n)], t, seconds).end;
    };
  };

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
    double ready;               // when the sender's link can start it
    const topology::link* link; // between the sender and the receiver
    double bytes;
    int from_node; // the sender's node, when the message leaves it; -1 otherwise
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
    plan_cursor at;
    bool arrived = false; // arrived at the sync at the cursor
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
  for (std::size_t r = 0; r < up; ++r)
    st[r].at = plan_cursor(plans[r].steps());
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
  // latency).
  const auto pull = [&](int q, int r, double t, double bytes) {
    const int from = node[static_cast<std::size_t>(q)];
    return rules::pulled<clock>(c, link_of(r, q), from != node[static_cast<std::size_t>(r)], t,
                                bytes, nic_of(from));
  };
  // Rank r, at step x, loads `bytes` from each of `sources` in turn from time t: when the last
  // has arrived.
  const auto load = [&](int r, const step& x, double t, std::span<const int> sources,
                        double bytes) {
    const auto pull_from = [&](int q, double from) {
      if (!rank_ok(q)) throw bad_peer(r, x);
      count_bytes(r, q, bytes);
      return pull(q, r, from, bytes);
    };
    const auto link_to = [&](int q) -> const topology::link& { return link_of(r, q); };
    return rules::loaded<clock>(t, sources, pull_from, link_to);
  };

  // Runs rank r until it blocks or finishes.
  const auto advance = [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    const plan& pl = plans[ur];
    const auto& steps = pl.steps();
    rank_state& s = st[ur];
    for (;;) {
      if (!s.at.is_open()) {
        if (s.at.finished()) return;
        const plan_round round = s.at.open();
        // The round's sends are all posted at its start, when r's link is free (the last
        // round's sends have been received): busy is when the link is free, from the start.
        double busy = 0;
        for (std::size_t i = round.begin; i < round.end; ++i) {
          const step& x = steps[i];
          if (x.kind != step_kind::send) continue;
          if (!rank_ok(x.peer) || x.peer == r) throw bad_peer(r, x);
          const double bytes = static_cast<double>(x.count) * es;
          const topology::link& l = link_of(r, x.peer);
          const bool leaves = node[ur] != node[static_cast<std::size_t>(x.peer)];
          const std::uint64_t key = channel_key(r, x.peer);
          channel& ch = channels[key];
          const double at = s.clock + rules::sent<clock>(busy, 0.0, l, bytes);
          ch.messages.push_back(message{at, &l, bytes, leaves ? node[ur] : -1});
          s.sent.emplace_back(key, ch.messages.size() - 1);
          count_bytes(r, x.peer, bytes);
          wake(x.peer);
        }
      }
      const step* const at = s.at.current();
      if (at == nullptr) {
        for (const auto& [key, idx] : s.sent) {
          const message& m = channels[key].messages[idx];
          if (!m.consumed) {
            s.blocked = true;
            return;
          }
          s.clock = std::max(s.clock, m.end);
        }
        s.sent.clear();
        s.at.close();
        continue;
      }
      const step& x = *at;
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
          m.end = rules::received<clock>(c, *m.link, m.from_node >= 0, s.clock, m.ready, m.bytes,
                                         nic_of(m.from_node));
          m.consumed = true;
          s.clock = m.end;
          if (x.kind == step_kind::recv_reduce) s.clock += bytes / reduce_bw;
          wake(x.peer);
          break;
        }
        case step_kind::copy:
        case step_kind::reduce: s.clock += bytes / reduce_bw; break;
        case step_kind::load: s.clock = load(r, x, s.clock, std::span(&x.peer, 1), bytes); break;
        case step_kind::load_reduce: {
          const auto& g = pl.group(x.peer);
          s.clock = load(r, x, s.clock, g, bytes);
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
              si.release = si.latest + rules::sync_latency(c, one_node);
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
      s.at.next();
      if (!ready.empty() &&
          ready.top() < entry{s.clock, r}) { // someone is earlier: let them go first
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
    if (!s.at.finished()) {
      const std::size_t i = std::min(s.at.index(), steps.size() - 1);
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

} // namespace weft::cost_model

#include <weft/core/detail/planning_end.hpp>
