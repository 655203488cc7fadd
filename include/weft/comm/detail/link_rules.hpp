#pragma once
// How transfers share a cluster's links: the rules the cost model (comm/plan/cost_model.hpp)
// prices plans by and the link pacer (comm/transport/detail/link_pacer.hpp) holds real
// transfers to, so that an emulated run can be checked against the model's prediction.
//
//   send     a rank's sends take its link one after another, in the order they are posted;
//            each holds it for bytes / bandwidth of the link to its receiver
//   receive  starts when the receiver has reached it and the message is ready, and is in
//            latency + bytes / bandwidth later
//   NICs     a transfer that leaves its node also takes the node's NIC pipe, one pipe of
//            nics_per_node x inter bandwidth shared by all the node's ranks in the order
//            their transfers start; each transfer still gets at most one NIC's worth (its
//            link's bandwidth), and is in no sooner than the pipe has carried it, plus the
//            latency
//   load     a reader pulls bytes from each source in turn, each pull a receive without
//            the latency (across nodes it takes the source node's NICs); the largest
//            latency of the sources then once
//   sync     one latency once every member has arrived: the intra-node one when all
//            members share a node, else the larger of intra- and inter-node
//
// The rules are written once over a clock: Clock::time is a point in time, Clock::after(t,
// seconds) a later one, and Clock::through(t, seconds, latency) when a transfer of `seconds`
// over a link of `latency` that starts at t is in. The cost model counts seconds in double
// (seconds_clock); the pacer counts nanoseconds of steady_clock and rounds each duration to
// whole nanoseconds as it adds it.
#include <weft/topology/topology.hpp>

#include <algorithm>

namespace weft::detail::link_rules {

/// The cost model's clock: seconds, as double.
struct seconds_clock {
  using time = double;
  static constexpr time after(time t, double seconds) { return t + seconds; }
  static constexpr time through(time t, double seconds, double latency) {
    return t + (latency + seconds);
  }
};

/// Seconds `bytes` hold link l, its latency aside.
constexpr double hold_seconds(const topology::link& l, double bytes) { return bytes / l.bandwidth; }

/// Seconds `bytes` hold a node's NIC pipe (all its NICs together).
inline double nic_seconds(const topology::cluster& c, double bytes) {
  return bytes / (static_cast<double>(c.nics_per_node()) * c.inter().bandwidth);
}

/// When a transfer offered to a pipe (a rank's link, a node's NICs) starts, and when it
/// frees the pipe again.
template <class Clock>
struct slot {
  typename Clock::time start;
  typename Clock::time end;
};

/// A pipe carries one transfer after another: one offered at t for `seconds` starts once the
/// pipe is free (at `free`), and holds it until `seconds` later, which becomes `free`.
template <class Clock>
constexpr slot<Clock> take(typename Clock::time& free, typename Clock::time t, double seconds) {
  const typename Clock::time start = std::max(free, t);
  free = Clock::after(start, seconds);
  return {start, free};
}

/// A message of `bytes` over link l, posted at t on a link free at `link_free`: when it is
/// ready to be received (its sender's link then carries it).
template <class Clock>
constexpr typename Clock::time sent(typename Clock::time& link_free, typename Clock::time t,
                                    const topology::link& l, double bytes) {
  return take<Clock>(link_free, t, hold_seconds(l, bytes)).start;
}

/// `bytes` of a source's memory through link l from t: when they are through, the latency
/// aside. When the transfer `leaves` the source's node, nic(t, seconds) takes that node's NIC
/// pipe for `seconds` from t and returns when the pipe has carried them.
template <class Clock, class Nic>
typename Clock::time pulled(const topology::cluster& c, const topology::link& l, bool leaves,
                            typename Clock::time t, double bytes, Nic&& nic) {
  typename Clock::time end = Clock::after(t, hold_seconds(l, bytes));
  if (leaves) end = std::max(end, nic(t, nic_seconds(c, bytes)));
  return end;
}

/// A message of `bytes` over link l, ready at `ready`, which the receiver reaches at
/// `reached`: when it is in. nic is pulled()'s.
template <class Clock, class Nic>
typename Clock::time received(const topology::cluster& c, const topology::link& l, bool leaves,
                              typename Clock::time reached, typename Clock::time ready,
                              double bytes, Nic&& nic) {
  const typename Clock::time start = std::max(reached, ready);
  typename Clock::time end = Clock::through(start, hold_seconds(l, bytes), l.latency);
  if (leaves) end = std::max(end, Clock::after(nic(start, nic_seconds(c, bytes)), l.latency));
  return end;
}

/// A reader loads from each of `sources` in turn, from t: when the last has arrived.
/// pull(source, t) is when that source's bytes are through (pulled()); link_of(source) the
/// link between the reader and it.
template <class Clock, class Sources, class Pull, class LinkOf>
typename Clock::time loaded(typename Clock::time t, const Sources& sources, Pull&& pull,
                            LinkOf&& link_of) {
  double latency = 0;
  for (int s : sources) {
    t = pull(s, t);
    latency = std::max(latency, link_of(s).latency);
  }
  return Clock::after(t, latency);
}

/// The latency a sync adds once all its members have arrived.
inline double sync_latency(const topology::cluster& c, bool one_node) {
  return one_node ? c.intra().latency : std::max(c.intra().latency, c.inter().latency);
}

} // namespace weft::detail::link_rules
