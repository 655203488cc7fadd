#pragma once
// measured_prices: automatic's prices measured on this machine instead of the cost model's
// nominal figures, for a communicator that asks for them (weft::local on one host, by default:
// local::options::automatic). The cost model prices a plan over a link's latency and
// bandwidth; on one host the ranks' futex hand-offs, shared caches and memory bandwidth do not
// follow those figures (4 ranks on 2 cores: recursive doubling priced at 3.6 us runs in
// 9-13 us, direct priced at 5.3 us runs in 6 us; at 1 MiB direct is priced at 269 us and runs
// in 120 us), so the host's prices come from the host.
//
//   first automatic call of collective C on the communicator (every rank makes it):
//     agree whether this process has measured C for this group shape already
//       (cached per communicator type, collective, group size and nodes: once per process)
//     else, for every candidate automatic may pick here, at 4 KiB, 16 KiB, ... 4 MiB per rank
//       (by factors of 4; fewer on large groups, so that the buffers stay within 256 MiB),
//       the candidates taking turns batch by batch at each size, each round starting one
//       candidate further on (none is always the first after the barrier):
//         one untimed call, then 3 batches of 8 calls back to back (2 above 64 KiB, 1
//         above 1 MiB), each batch after a barrier: the fastest batch's mean per call;
//         the slowest rank's figure, gathered from every rank
//         past 64 KiB, no larger size once a call has taken over 20 ms (a slow machine, or
//         a sanitizer's build, measures less)
//     and the communicator's own collective (algo::vendor: MPI's, say) likewise, where it
//     has one for float sums: automatic then weighs the vendor by this measurement
//   first automatic call of C past the measured sizes (over 4 MiB per rank), every rank again:
//     the same for 16 and 64 MiB (those within 256 MiB of buffers), for the candidates
//     measured at every size so far, kept beside the first measurement (once per process)
//   every call: the candidate whose measured time, interpolated at the call's bytes, is least
//     (linear between measured sizes, the smallest size's time below them, the last
//     segment's slope above them; a tie goes to the earlier candidate)
//
// Why the sizes past 4 MiB only when a call needs them: measuring them triples the
// measurement's time, which a program calling nothing that large would pay for nothing; and
// the 1-4 MiB slope does not rank the larger sizes: on one 2-core machine all but recursive
// doubling ran within 1.1x of each other at 16 and 64 MiB, on another (a 480 MiB L3) tree led
// at 4 MiB and direct was 1.2-1.6x faster than tree at 16 and 64 MiB.
//
// What it costs: at the first automatic call of each collective on a group shape, every
// candidate runs up to 25 times per size; on 4 ranks of this 2-core machine, idle, about
// 0.05 s for all_reduce (0.25 s for all six collectives). Every rank of the group must make
// that call (it is a collective, as the call is); weft::automatic_choice on such a
// communicator is collective at first use too.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/detail/plan_cache.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <vector>

namespace weft {

/// Measured seconds of one call of every candidate of automatic at a few sizes.
struct measured_prices {
  std::vector<double> bytes;                // per rank, in plan.hpp's count sense; ascending
  std::vector<std::vector<double>> seconds; // [candidate][size]: the first sizes only, or
                                            // none (not measured)

  std::vector<double> vendor; // the vendor collective's, at the first sizes; or none
  bool large = false;         // the sizes past 4 MiB are measured (those within the cap)

  /// Seconds for candidate i at b bytes (see the header); infinity where i is not measured.
  [[nodiscard]] double estimate(std::size_t i, double b) const {
    if (i >= seconds.size()) return std::numeric_limits<double>::infinity();
    return interpolate(seconds[i], b);
  }
  /// Seconds for the vendor collective at b bytes; none where it is not measured.
  [[nodiscard]] std::optional<double> vendor_estimate(double b) const {
    if (vendor.empty()) return std::nullopt;
    return interpolate(vendor, b);
  }

  /// Seconds at b bytes from times t at the first t.size() of `bytes` (see the header).
  [[nodiscard]] double interpolate(const std::vector<double>& t, double b) const {
    if (t.empty() || bytes.empty()) return std::numeric_limits<double>::infinity();
    const std::size_t n = std::min(t.size(), bytes.size());
    if (b <= bytes.front() || n == 1) return t.front();
    std::size_t k = 1;
    while (k + 1 < n && b > bytes[k])
      ++k;
    const double slope = (t[k] - t[k - 1]) / (bytes[k] - bytes[k - 1]);
    return std::max(0.0, t[k - 1] + slope * (b - bytes[k - 1]));
  }

  /// The candidate automatic takes for q (eligible as choose() has them): the least estimate;
  /// null where none is measured and eligible.
  [[nodiscard]] const algo::candidate* pick(const plan_request& q, bool peer_access, bool messages,
                                            double* price = nullptr) const {
    const auto table = algo::candidates();
    const double b = static_cast<double>(q.count) * static_cast<double>(q.element_size);
    const algo::candidate* best = nullptr;
    double best_t = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (!detail::eligible(table[i], q, peer_access, messages)) continue;
      const double t = estimate(i, b);
      if (t < best_t) {
        best = &table[i];
        best_t = t;
      }
    }
    if (price != nullptr) *price = best_t;
    return best;
  }
};

namespace detail {

/// The sizes measured first per rank, 4 KiB .. 4 MiB (large: 16 and 64 MiB, measured at the first
/// call past 4 MiB); fewer where p ranks' buffers would pass 256 MiB (never fewer than one first).
inline std::vector<double> measured_sizes(collective c, int p, bool large = false) {
  const bool blocked =
      c == collective::reduce_scatter || c == collective::all_gather || c == collective::all_to_all;
  const double per_byte = 2.0 * p * (blocked ? p : 1); // input and output on every rank
  std::vector<double> out;
  const double from = large ? 16.0 * 1048576.0 : 4096.0;
  const double to = large ? 64.0 * 1048576.0 : 4194304.0;
  for (double b = from; b <= to; b *= 4)
    if ((out.empty() && !large) || b * per_byte <= 256.0 * 1048576.0) out.push_back(b);
  return out;
}

/// Every rank's `mine`, gathered with weft's ring plan (no automatic inside), on the path the
/// measurement runs itself (float, op::sum: the operator goes unused), so that agreeing on a
/// figure compiles no plan run of its own.
template <class Comm>
WEFT_COLD std::vector<float> gather_all(Comm& comm, float mine) {
  const plan_request q{collective::all_gather, comm.size(),  comm.rank(), 1, 0,
                       comm.node_of(),         sizeof(float)};
  const plan& pl = plan_cache::mine().get(
      algo::ring::name, q, [](const plan_request& r) { return algo::ring::make_plan(r); });
  std::vector<float> all(static_cast<std::size_t>(comm.size()));
  comm.execute(pl, &mine, 1, all.data(), all.size(), op::sum{}, "measure automatic");
  return all;
}

/// Past this size a candidate is measured at larger sizes only while its calls stay below
/// measured_call_limit seconds.
inline constexpr double measured_always_bytes = 65536;
/// Timed batches of calls per candidate and size (see time_sizes).
inline constexpr int measured_batches = 3;
inline constexpr double measured_call_limit = 0.02;

/// Times each of several callers of collective c on comm at each of m's sizes from the first-th
/// on, all ranks together: run(j, count, in_n, out_n) makes one call of caller j, whose times go
/// to *into[j] (a caller with a time at every size before `first` goes on);
/// in and out are the buffers the calls read and write, sized here. At each size the callers
/// take turns, batch by batch, so that a passing disturbance of the machine falls on all of
/// them rather than on whichever was being timed; each round starts one caller further on, so
/// that none always runs first after the barrier, while some ranks may still be waking (4
/// threads on 2 cores: in a fixed order recursive doubling took 4 KiB in 2 processes of 8,
/// rotating, direct took it in 9 of 10). A caller goes on to larger sizes while its calls stay
/// short (see the top of this header).
template <class Comm, class Run>
WEFT_COLD void time_sizes(Comm& comm, collective c, const measured_prices& m,
                          const std::vector<std::vector<double>*>& into, std::vector<float>& in,
                          std::vector<float>& out, const Run& run, std::size_t first = 0) {
  using clock = std::chrono::steady_clock;
  const auto up = static_cast<std::size_t>(comm.size());
  const bool blocks_in = c == collective::reduce_scatter || c == collective::all_to_all;
  const bool blocks_out = c == collective::all_gather || c == collective::all_to_all;
  std::vector<std::size_t> live;
  std::vector<double> fastest(into.size());
  for (std::size_t s = first; s < m.bytes.size(); ++s) {
    const double b = m.bytes[s];
    // The same on every rank: the times are the gathered ones.
    live.clear();
    for (std::size_t j = 0; j < into.size(); ++j) {
      const std::vector<double>& t = *into[j];
      if (t.size() == s &&
          (b <= measured_always_bytes || t.empty() || t.back() <= measured_call_limit))
        live.push_back(j);
    }
    if (live.empty()) break;
    const auto count = static_cast<std::size_t>(b) / sizeof(float);
    const std::size_t in_n = count * (blocks_in ? up : 1);
    const std::size_t out_n = count * (blocks_out ? up : 1);
    in.assign(in_n, 1.0f);
    out.assign(out_n, 0.0f);
    // Calls back to back, as a program makes them (a plan's hand-offs and staging overlap the
    // next call's), in batches after a barrier: a batch's mean is what a run of calls costs,
    // and since interference only adds time, the fastest batch is this machine's figure.
    const int batch = b <= 65536 ? 8 : b <= 1048576 ? 2 : 1;
    for (const std::size_t j : live) {
      run(j, count, in_n, out_n); // untimed: first touches, the plan's first build
      fastest[j] = std::numeric_limits<double>::infinity();
    }
    for (int k = 0; k < measured_batches; ++k) {
      for (std::size_t q = 0; q < live.size(); ++q) {
        const std::size_t j = live[(q + static_cast<std::size_t>(k)) % live.size()];
        comm.barrier();
        const auto t0 = clock::now();
        for (int i = 0; i < batch; ++i)
          run(j, count, in_n, out_n);
        const double t = std::chrono::duration<double>(clock::now() - t0).count();
        fastest[j] = std::min(fastest[j], t / batch);
      }
    }
    // The slowest rank's, the same on every rank: so are the sizes each rank measures next.
    for (const std::size_t j : live) {
      const std::vector<float> all = gather_all(comm, static_cast<float>(fastest[j]));
      into[j]->push_back(static_cast<double>(*std::max_element(all.begin(), all.end())));
    }
  }
}

/// No vendor collective to measure (measure_prices' default).
struct no_vendor {};

/// Measures every eligible candidate for collective c on comm, all ranks together, and the
/// communicator's own collective where vendor(src, in_n, dst, out_n, count) makes one call of it.
/// base: the first measurement, continued at the large sizes (measured_sizes).
template <class Comm, class Vendor = no_vendor>
WEFT_COLD measured_prices measure_prices(Comm& comm, collective c, bool peer_access, bool messages,
                                         const Vendor& vendor = {},
                                         const measured_prices* base = nullptr) {
  constexpr bool has_vendor = !std::is_same_v<Vendor, no_vendor>;
  const int p = comm.size();
  measured_prices m;
  m.bytes = measured_sizes(c, p);
  if (base != nullptr) {
    m = *base;
    const std::vector<double> more = measured_sizes(c, p, true);
    m.bytes.insert(m.bytes.end(), more.begin(), more.end());
    m.large = true;
  }
  const auto table = algo::candidates();
  if (base == nullptr) m.seconds.assign(table.size(), {});
  const plan_request shape{c, p, comm.rank(), 1, 0, comm.node_of(), sizeof(float)};
  std::vector<std::size_t> candidate; // caller j times table[candidate[j]]; the vendor is last
  std::vector<std::vector<double>*> into;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (!eligible(table[i], shape, peer_access, messages)) continue;
    candidate.push_back(i);
    into.push_back(&m.seconds[i]);
  }
  if constexpr (has_vendor) into.push_back(&m.vendor);
  std::vector<float> in, out;
  time_sizes(
      comm, c, m, into, in, out,
      [&](std::size_t j, std::size_t count, std::size_t in_n, std::size_t out_n) {
        const float* const src = c == collective::broadcast ? out.data() : in.data();
        if constexpr (has_vendor) {
          if (j == candidate.size()) {
            vendor(src, in_n, out.data(), out_n, count);
            return;
          }
        }
        const algo::candidate& a = table[candidate[j]];
        plan_request q = shape;
        q.count = count;
        const plan& pl = plan_cache::mine().get(a.name, q, a.make_plan);
        comm.execute(pl, src, in_n, out.data(), out_n, op::sum{}, "measure automatic");
      },
      base != nullptr ? base->bytes.size() : 0);
  return m;
}

/// What this process has measured, by communicator type, collective, group size and nodes (and
/// the flags: peer access, messages, vendor, large sizes).
/// Not by the cluster's figures, nor by which devices the ranks are: only a communicator whose
/// links are the machine's own measures (weft::local without emulated links; MPI across its
/// nodes), and its speed is the machine's whatever the cluster says, so groups of one shape
/// (the TP groups of a mesh, say) share one measurement.
struct measured_cache {
  using key = std::tuple<std::type_index, int, int, std::vector<int>, bool, bool, bool, bool>;
  std::mutex mutex;
  std::map<key, std::shared_ptr<const measured_prices>> prices;
};

inline measured_cache& measured() {
  static measured_cache cache;
  return cache;
}

/// The measured prices of c on comm: this process's, where every rank finds them, else
/// measured now by measure(), all ranks together, and kept. vendor: whether measure() times
/// the communicator's own collective too; large: whether it measures the large sizes too (each
/// a key of its own).
template <class Comm, class Measure>
WEFT_COLD std::shared_ptr<const measured_prices> cached_prices(Comm& comm, collective c,
                                                               bool peer_access, bool messages,
                                                               bool vendor, bool large,
                                                               const Measure& measure) {
  measured_cache::key key{std::type_index(typeid(Comm)),
                          static_cast<int>(c),
                          comm.size(),
                          comm.node_of(),
                          peer_access,
                          messages,
                          vendor,
                          large};
  std::shared_ptr<const measured_prices> found;
  {
    auto& cache = measured();
    const std::lock_guard lock(cache.mutex);
    if (const auto it = cache.prices.find(key); it != cache.prices.end()) found = it->second;
  }
  // Every rank must take the same prices: the cached ones only where all ranks have them
  // (another group of this shape may be storing them while this one looks).
  const std::vector<float> all_found = gather_all(comm, found ? 1.0f : 0.0f);
  if (std::all_of(all_found.begin(), all_found.end(), [](float f) { return f == 1.0f; }))
    return found;
  auto mine = std::make_shared<const measured_prices>(measure());
  {
    auto& cache = measured();
    const std::lock_guard lock(cache.mutex);
    cache.prices.try_emplace(std::move(key), mine);
  }
  return mine;
}

/// The measured prices of C on comm (cached_prices); Vendor: the communicator's own collective
/// for float sums is measured beside weft's candidates. large: the first measurement continued
/// at the large sizes (the first measured or found first).
template <collective C, bool Vendor, class Comm>
WEFT_COLD std::shared_ptr<const measured_prices> measured_prices_for(Comm& comm, bool peer_access,
                                                                     bool messages,
                                                                     bool large = false) {
  const auto measure = [&](const measured_prices* base) {
    if constexpr (Vendor) {
      return measure_prices(
          comm, C, peer_access, messages,
          [&](const float* src, std::size_t in_n, float* dst, std::size_t out_n,
              std::size_t count) {
            comm.template vendor<C>(src, in_n, dst, out_n, count, 0, op::sum{});
          },
          base);
    } else {
      return measure_prices(comm, C, peer_access, messages, no_vendor{}, base);
    }
  };
  const auto first = cached_prices(comm, C, peer_access, messages, Vendor, false,
                                   [&] { return measure(nullptr); });
  if (!large) return first;
  return cached_prices(comm, C, peer_access, messages, Vendor, true,
                       [&] { return measure(first.get()); });
}

/// The measured prices of collective c on comm, without a vendor collective: what the local
/// transport measures where automatic picks by measured prices (local::options::automatic). One
/// function for every collective, so that a program compiles the measurement once. large: the
/// first measurement continued at the large sizes.
template <class Comm>
std::shared_ptr<const measured_prices> measure_collective(Comm& comm, collective c,
                                                          bool peer_access, bool messages,
                                                          bool large) {
  const auto first = cached_prices(comm, c, peer_access, messages, false, false,
                                   [&] { return measure_prices(comm, c, peer_access, messages); });
  if (!large) return first;
  return cached_prices(comm, c, peer_access, messages, false, true, [&] {
    return measure_prices(comm, c, peer_access, messages, no_vendor{}, first.get());
  });
}

} // namespace detail

} // namespace weft
