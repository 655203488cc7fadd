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
//     agree whether every rank holds a measurement of C for this group shape already (cached
//       per communicator type, collective, group size and nodes: once per process): the same
//       one (by digest) is taken; different ones (a process in several groups of one shape
//       holds the last one's), the lowest rank's, sent to all
//     else, for every candidate automatic may pick here, at 4 KiB, 16 KiB, ... 4 MiB per rank
//       (by factors of 4; fewer on large groups, so that the buffers and the plans' scratch of
//       a node's ranks stay within 256 MiB),
//       the candidates taking turns batch by batch at each size, each round starting one
//       candidate further on (none is always the first after the barrier):
//         one untimed call, then 3 batches of 8 calls back to back (2 above 64 KiB, 4
//         above 1 MiB, 1 above 4 MiB), each after a barrier and one untimed call: the median
//         batch's mean per call;
//         the slowest rank's figure, gathered from every rank
//         past 64 KiB, no larger size once a call has taken over 20 ms (a slow machine, or
//         a sanitizer's build, measures less)
//     and the communicator's own collective (algo::vendor: MPI's, say) likewise, where it
//     has one for float sums: automatic then weighs the vendor by this measurement
//   first automatic call of C past the measured sizes (over 4 MiB per rank), every rank again:
//     the communicator's table continued at 16 and 64 MiB (those within 1 GiB a node: on 4
//     ranks of one node, both for all_reduce, broadcast and reduce, 16 MiB only for
//     reduce_scatter, all_gather and all_to_all; none on one rank), for
//     the candidates it measured at every size so far, past 20 ms too where within 1.5x of
//     the fastest (agreed and cached as above, by the table it continues); a communicator
//     whose measure_prices takes no table to continue (three arguments) extrapolates instead
//   every call: the candidate whose measured time, interpolated at the call's bytes, is least
//     (linear between measured sizes, the smallest size's time below them, the last
//     segment's slope above them; a tie goes to the earlier candidate). Past its last
//     measured size, a candidate that another one outlasted (it passed the 20 ms while the
//     other did not) is not taken
//
// Why the sizes past 4 MiB only when a call needs them: measuring them takes many times the
// first sizes' time (below), which a program calling nothing that large would pay for nothing;
// and
// the 1-4 MiB slope does not rank the larger sizes: on one 2-core machine all but recursive
// doubling ran within 1.1x of each other at 16 and 64 MiB, on another (a 480 MiB L3) tree led
// at 4 MiB and direct was 1.2-1.6x faster than tree at 16 and 64 MiB.
//
// What it costs: at the first automatic call of each collective on a group shape, every
// candidate runs up to 28 times per size; on 4 ranks of this 2-core machine, idle, about
// 0.21 s for all_reduce (0.9 s for all six collectives; 0.12 s and 0.55 s with one call a
// batch at 4 MiB), and about 2 s more at the first all_reduce past 4 MiB (4 ranks at 16 and
// 64 MiB), after which each rank keeps the plans' scratch at its largest, as after a call of
// that size. Every rank of the group must make that call (it is a collective, as the call
// is), and every rank its first call past 4 MiB; weft::automatic_choice on such a
// communicator is collective at those calls too.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/detail/plan_cache.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/detail/fnv1a.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
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
  std::vector<std::vector<double>> seconds; // [candidate][size]: at the first of `bytes`
                                            // (those it was measured at), or none

  std::vector<double> vendor; // the vendor collective's, likewise; or none
  bool large = false;         // the sizes past 4 MiB are measured (those within the cap)

  /// Seconds for candidate i at b bytes (see the header); infinity where i is not measured,
  /// or b is past its last measured size and another candidate's times reach further.
  [[nodiscard]] double estimate(std::size_t i, double b) const {
    if (i >= seconds.size()) return std::numeric_limits<double>::infinity();
    return interpolate(seconds[i], b, reach());
  }
  /// Seconds for the vendor collective at b bytes (as estimate: infinity past its last size
  /// where a candidate's times reach further); none where it is not measured.
  [[nodiscard]] std::optional<double> vendor_estimate(double b) const {
    if (vendor.empty()) return std::nullopt;
    return interpolate(vendor, b, reach());
  }

  /// The most sizes any candidate is measured at.
  [[nodiscard]] std::size_t reach() const {
    std::size_t n = 0;
    for (const auto& t : seconds)
      n = std::max(n, t.size());
    return std::min(n, bytes.size());
  }

  /// Seconds at b bytes from times t at the first t.size() of `bytes` (see the header):
  /// infinity past them where a table measured at `reach` sizes went further.
  [[nodiscard]] double interpolate(const std::vector<double>& t, double b,
                                   std::size_t reach) const {
    if (t.empty() || bytes.empty()) return std::numeric_limits<double>::infinity();
    const std::size_t n = std::min(t.size(), bytes.size());
    if (n < reach && b > bytes[n - 1]) return std::numeric_limits<double>::infinity();
    if (b <= bytes.front() || n == 1) return t.front();
    std::size_t k = 1;
    while (k + 1 < n && b > bytes[k])
      ++k;
    const double slope = (t[k] - t[k - 1]) / (bytes[k] - bytes[k - 1]);
    return std::max(0.0, t[k - 1] + slope * (b - bytes[k - 1]));
  }

  /// The candidate automatic takes for q (eligible as choose() has them): the least estimate
  /// (past the sizes an eligible candidate's times reach, or the vendor's where it competes,
  /// none); null where none is measured and eligible.
  [[nodiscard]] const algo::candidate* pick(const plan_request& q, bool peer_access, bool messages,
                                            double* price = nullptr,
                                            bool vendor_competes = false) const {
    const auto table = algo::candidates();
    const double b = static_cast<double>(q.count) * static_cast<double>(q.element_size);
    const bool nodes = detail::spans_nodes(q.node_of);
    const std::size_t n = std::min(table.size(), seconds.size());
    std::size_t far = vendor_competes ? std::min(vendor.size(), bytes.size()) : 0;
    for (std::size_t i = 0; i < n; ++i)
      if (detail::eligible(table[i], q.coll, nodes, peer_access, messages))
        far = std::max(far, std::min(seconds[i].size(), bytes.size()));
    const algo::candidate* best = nullptr;
    double best_t = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
      if (!detail::eligible(table[i], q.coll, nodes, peer_access, messages)) continue;
      const double t = interpolate(seconds[i], b, far);
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

/// The largest of the first sizes measured per rank: a call past it measures the large ones.
inline constexpr double measured_first_bytes = 4194304.0;

/// The sizes measured per rank: 4 KiB .. 4 MiB by factors of 4 first; large: 16 and 64 MiB, at
/// the first call past 4 MiB (measure_prices keeps those within measured_memory_bytes).
inline std::vector<double> measured_sizes(bool large) {
  std::vector<double> out;
  const double from = large ? 4.0 * measured_first_bytes : 4096.0;
  const double to = large ? 16.0 * measured_first_bytes : measured_first_bytes;
  for (double b = from; b <= to; b *= 4)
    out.push_back(b);
  return out;
}

/// The most memory a measurement takes on a node, its ranks' buffers and plan scratch together:
/// at the first sizes, and at the large ones (measured only for a program that calls past 4 MiB
/// per rank, whose own buffers are of that order).
inline constexpr double measured_memory_bytes = 256.0 * 1048576.0;
inline constexpr double measured_large_memory_bytes = 1024.0 * 1048576.0;

/// What rank shape.rank holds to measure candidates at each of `sizes` (bytes per rank, float
/// elements): its input and output, and the largest scratch of the candidates' plans (built
/// here, not kept).
inline std::vector<float> held_bytes(const plan_request& shape,
                                     const std::vector<const algo::candidate*>& candidates,
                                     const std::vector<double>& sizes) {
  const auto up = static_cast<std::size_t>(shape.size);
  const collective c = shape.coll;
  const bool blocks_in = input_per_rank(c);
  const bool blocks_out = output_per_rank(c);
  std::vector<float> held;
  for (const double b : sizes) {
    plan_request q = shape;
    q.count = static_cast<std::size_t>(b) / sizeof(float);
    std::size_t scratch = 0;
    for (const algo::candidate* a : candidates)
      scratch = std::max(scratch, a->make_plan(q).scratch_count());
    const std::size_t elements = q.count * ((blocks_in ? up : 1) + (blocks_out ? up : 1)) + scratch;
    held.push_back(static_cast<float>(static_cast<double>(elements) * sizeof(float)));
  }
  return held;
}

/// How many of `sizes` (ascending) a measurement takes: those at which every node's ranks hold
/// at most `cap` bytes together; held[r * sizes.size() + k]: what rank r holds at size k (the
/// same figures, so the same answer, on every rank). At least one where keep_first.
inline std::size_t sizes_within(std::size_t sizes, const std::vector<float>& held,
                                const std::vector<int>& node_of, double cap, bool keep_first) {
  const std::size_t ranks = sizes == 0 ? 0 : held.size() / sizes;
  std::size_t n = 0;
  for (; n < sizes; ++n) {
    std::map<int, double> node_total; // node_of empty: all on node 0
    for (std::size_t r = 0; r < ranks; ++r)
      node_total[r < node_of.size() ? node_of[r] : 0] += static_cast<double>(held[r * sizes + n]);
    const bool fits = std::all_of(node_total.begin(), node_total.end(),
                                  [&](const auto& t) { return t.second <= cap; });
    if (!fits && !(keep_first && n == 0)) break;
  }
  return n;
}

/// Every rank's `mine`, gathered with weft's ring plan (no automatic inside), on the path the
/// measurement runs itself (float, op::sum: the operator goes unused), so that agreeing on
/// figures compiles no plan run of its own: rank r's k figures at [r k, r k + k).
template <class Comm>
WEFT_COLD std::vector<float> gather_all(Comm& comm, const std::vector<float>& mine) {
  const plan_request q{collective::all_gather, comm.size(),  comm.rank(), mine.size(), 0,
                       comm.node_of(),         sizeof(float)};
  const plan& pl = plan_cache::mine().get(
      algo::ring::name, q, [](const plan_request& r) { return algo::ring::make_plan(r); });
  std::vector<float> all(static_cast<std::size_t>(comm.size()) * mine.size());
  comm.execute(pl, mine.data(), mine.size(), all.data(), all.size(), op::sum{},
               "measure automatic");
  return all;
}

/// Past this size a candidate is measured at larger sizes only while its calls stay below
/// measured_call_limit seconds.
inline constexpr double measured_always_bytes = 65536;
/// Timed batches of calls per candidate and size (see time_sizes).
inline constexpr int measured_batches = 3;
inline constexpr double measured_call_limit = 0.02;
/// At the large sizes, a caller within this factor of the fastest at the size before goes on
/// past measured_call_limit (while under measured_contender_limit): a call needs the size, and
/// noise at the limit must not decide.
inline constexpr double measured_contender = 1.5;
inline constexpr double measured_contender_limit = 1.0;

/// Times each of several callers of collective c on comm at each of m's sizes from the first-th
/// on, all ranks together: run(j, count, in_n, out_n) makes one call of caller j, whose times go
/// to *into[j] (a caller with a time at every size before `first` goes on, see live below);
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
  const bool blocks_in = input_per_rank(c);
  const bool blocks_out = output_per_rank(c);
  std::vector<std::size_t> live;
  std::vector<std::array<double, measured_batches>> batches(into.size());
  for (std::size_t s = first; s < m.bytes.size(); ++s) {
    const double b = m.bytes[s];
    // The same on every rank: the times are the gathered ones. Past the first sizes (a call
    // needs them), a caller within measured_contender of the fastest goes on whatever its time.
    double best = std::numeric_limits<double>::infinity();
    for (const auto* t : into)
      if (t->size() == s && !t->empty()) best = std::min(best, t->back());
    live.clear();
    for (std::size_t j = 0; j < into.size(); ++j) {
      const std::vector<double>& t = *into[j];
      if (t.size() == s &&
          (b <= measured_always_bytes || t.empty() || t.back() <= measured_call_limit ||
           (first > 0 && t.back() <= measured_contender * best &&
            t.back() <= measured_contender_limit)))
        live.push_back(j);
    }
    if (live.empty()) break;
    const auto count = static_cast<std::size_t>(b) / sizeof(float);
    const std::size_t in_n = count * (blocks_in ? up : 1);
    const std::size_t out_n = count * (blocks_out ? up : 1);
    in.assign(in_n, 1.0f);
    out.assign(out_n, 0.0f);
    // Calls back to back, as a program makes them (a plan's hand-offs and staging overlap the
    // next call's), in batches after a barrier and one untimed call: a batch's mean is what a
    // run of calls costs, and the median batch is what the candidate costs most of the time.
    // The fastest batch would rank a candidate whose time swings (one lucky batch) above
    // steadier ones; without the untimed call the ranks' wake-up from the barrier falls on a
    // short batch (2 calls at 256 KiB: tree measures 35-37 us so, and runs at 30-31 in
    // weft-perf). At 4 MiB one call a batch prices direct near tree, and takes it in 8 of 16
    // runs of weft-perf where direct's table runs 1.11-1.24x tree's; 4 calls a batch take tree
    // in 24 of 26 (7 of 8 with 4 calls past 4 MiB too, 17 of 18 as here).
    const int batch = b <= 65536 ? 8 : b <= 1048576 ? 2 : b <= 4194304 ? 4 : 1;
    for (const std::size_t j : live)
      run(j, count, in_n, out_n); // untimed: first touches, the plan's first build
    for (int k = 0; k < measured_batches; ++k) {
      for (std::size_t q = 0; q < live.size(); ++q) {
        const std::size_t j = live[(q + static_cast<std::size_t>(k)) % live.size()];
        comm.barrier();
        run(j, count, in_n, out_n); // untimed: the ranks leave the barrier one by one
        const auto t0 = clock::now();
        for (int i = 0; i < batch; ++i)
          run(j, count, in_n, out_n);
        batches[j][static_cast<std::size_t>(k)] =
            std::chrono::duration<double>(clock::now() - t0).count() / batch;
      }
    }
    // The slowest rank's, the same on every rank: so are the sizes each rank measures next.
    std::vector<float> mine;
    for (const std::size_t j : live) {
      std::ranges::sort(batches[j]);
      mine.push_back(static_cast<float>(batches[j][measured_batches / 2]));
    }
    const std::vector<float> all = gather_all(comm, mine);
    for (std::size_t q = 0; q < live.size(); ++q) {
      float slowest = 0;
      for (std::size_t r = 0; r < up; ++r)
        slowest = std::max(slowest, all[r * live.size() + q]);
      into[live[q]]->push_back(static_cast<double>(slowest));
    }
  }
}

/// No vendor collective to measure (measure_prices' default).
struct no_vendor {};

/// Measures every eligible candidate for collective c on comm, all ranks together, and the
/// communicator's own collective where vendor(src, in_n, dst, out_n, count) makes one call of it.
/// base: a table of the first sizes to continue at the large ones (measured_sizes), for the
/// callers it measured at every size; the sizes are those whose buffers and plan scratch stay
/// within measured_memory_bytes (measured_large_memory_bytes) on every node (at least one first
/// size). A base that is not automatic's table of the first sizes (another candidate list, or
/// large already), or one rank alone, is returned as it is, marked large: extrapolated.
template <class Comm, class Vendor = no_vendor>
WEFT_COLD measured_prices measure_prices(Comm& comm, collective c, bool peer_access, bool messages,
                                         const Vendor& vendor = {},
                                         const measured_prices* base = nullptr) {
  constexpr bool has_vendor = !std::is_same_v<Vendor, no_vendor>;
  const int p = comm.size();
  const auto table = algo::candidates();
  measured_prices m;
  if (base != nullptr) {
    m = *base;
    m.large = true;
    if (p == 1 || base->large || base->seconds.size() != table.size()) return m;
  } else {
    m.seconds.assign(table.size(), {});
  }
  const plan_request shape{c, p, comm.rank(), 1, 0, comm.node_of(), sizeof(float)};
  std::vector<std::size_t> candidate; // caller j times table[candidate[j]]; the vendor is last
  std::vector<std::vector<double>*> into;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (!eligible(table[i], shape, peer_access, messages)) continue;
    candidate.push_back(i);
    into.push_back(&m.seconds[i]);
  }
  if constexpr (has_vendor) into.push_back(&m.vendor);

  // The sizes, by what each rank holds at each, summed over each node's ranks. A base whose
  // callers all stopped short of the last first size (their calls past measured_call_limit, as
  // under a sanitizer) continues there: the first sizes it did not reach, then the large ones.
  std::vector<double> sizes = measured_sizes(base != nullptr);
  if (base != nullptr) {
    const std::vector<double> first = measured_sizes(false);
    sizes.insert(
        sizes.begin(),
        first.begin() + static_cast<std::ptrdiff_t>(std::min(first.size(), base->bytes.size())),
        first.end());
  }
  std::vector<const algo::candidate*> timed;
  for (const std::size_t i : candidate)
    timed.push_back(&table[i]);
  const std::size_t fit = sizes_within(
      sizes.size(), gather_all(comm, held_bytes(shape, timed, sizes)), comm.node_of(),
      base != nullptr ? measured_large_memory_bytes : measured_memory_bytes, base == nullptr);
  m.bytes.insert(m.bytes.end(), sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(fit));

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
  // No size that nothing reached (every caller stopped before it).
  const std::size_t reached = std::max<std::size_t>(m.reach(), m.vendor.size());
  m.bytes.resize(std::max<std::size_t>(reached, 1));
  return m;
}

/// What this process has measured, by communicator type, collective, group size and nodes (and
/// the flags: peer access, messages, vendor; and for a table of the large sizes, the digest of
/// the table it continues, 0 for a first table).
/// Not by the cluster's figures, nor by which devices the ranks are: only a communicator whose
/// links are the machine's own measures (weft::local without emulated links; MPI across its
/// nodes), and its speed is the machine's whatever the cluster says, so groups of one shape
/// (the TP groups of a mesh, say) share one measurement.
struct measured_cache {
  using key =
      std::tuple<std::type_index, int, int, std::vector<int>, bool, bool, bool, std::uint64_t>;
  std::mutex mutex;
  std::map<key, std::shared_ptr<const measured_prices>> prices;
};

inline measured_cache& measured() {
  static measured_cache cache;
  return cache;
}

/// A table as floats that carry it exactly (counts, and each double in four 16-bit parts), for
/// gather_all; unpack reads it back.
inline std::vector<float> pack(const measured_prices& m) {
  std::vector<float> out;
  const auto count = [&](std::size_t n) { out.push_back(static_cast<float>(n)); };
  const auto numbers = [&](const std::vector<double>& v) {
    count(v.size());
    for (const double d : v) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      for (int k = 0; k < 4; ++k)
        out.push_back(static_cast<float>((bits >> (16 * k)) & 0xffffu));
    }
  };
  numbers(m.bytes);
  count(m.seconds.size());
  for (const auto& t : m.seconds)
    numbers(t);
  numbers(m.vendor);
  count(m.large ? 1 : 0);
  return out;
}

inline measured_prices unpack(const float* f) {
  measured_prices m;
  const auto count = [&] { return static_cast<std::size_t>(*f++); };
  const auto numbers = [&] {
    std::vector<double> v(count());
    for (double& d : v) {
      std::uint64_t bits = 0;
      for (int k = 0; k < 4; ++k)
        bits |= static_cast<std::uint64_t>(*f++) << (16 * k);
      std::memcpy(&d, &bits, sizeof d);
    }
    return v;
  };
  m.bytes = numbers();
  m.seconds.resize(count());
  for (auto& t : m.seconds)
    t = numbers();
  m.vendor = numbers();
  m.large = count() != 0;
  return m;
}

/// A digest of a table as pack encodes it (FNV-1a of its floats): what the ranks of a group
/// compare to agree that they hold the same table.
inline std::uint64_t digest(const std::vector<float>& packed) {
  return fnv1a(std::as_bytes(std::span(packed)));
}
inline std::uint64_t digest(const measured_prices& m) { return digest(pack(m)); }

/// The measured prices of c on comm, the same on every rank: this process's where every rank
/// holds the same table (by its digest); the lowest rank's where every rank holds one but they
/// differ (a process in several groups of one shape holds the last one's); else measured now by
/// measure(), all ranks together. What is taken is kept in place of this process's. vendor:
/// whether measure() times the communicator's own collective too; base: the table measure()
/// continues at the large sizes, or none (each a key of its own).
template <class Comm, class Measure>
WEFT_COLD std::shared_ptr<const measured_prices> cached_prices(Comm& comm, collective c,
                                                               bool peer_access, bool messages,
                                                               bool vendor,
                                                               const measured_prices* base,
                                                               const Measure& measure) {
  measured_cache::key key{std::type_index(typeid(Comm)),
                          static_cast<int>(c),
                          comm.size(),
                          comm.node_of(),
                          peer_access,
                          messages,
                          vendor,
                          base != nullptr ? digest(*base) | 1 : 0};
  std::shared_ptr<const measured_prices> found;
  {
    auto& cache = measured();
    const std::lock_guard lock(cache.mutex);
    if (const auto it = cache.prices.find(key); it != cache.prices.end()) found = it->second;
  }
  // Whether each rank holds one, its digest in three 22-bit parts (each exact in a float), and
  // its packed length. Another group of this shape may be storing one while this one looks.
  constexpr std::size_t fields = 5;
  std::vector<float> packed;
  std::vector<float> mine(fields, 0.0f);
  if (found) {
    packed = pack(*found);
    const std::uint64_t d = digest(packed);
    mine[0] = 1;
    for (std::size_t k = 0; k < 3; ++k)
      mine[1 + k] = static_cast<float>((d >> (22 * k)) & ((std::uint64_t{1} << 22) - 1));
    mine[4] = static_cast<float>(packed.size());
  }
  const std::vector<float> all = gather_all(comm, mine);
  bool every = true;
  bool same = true;
  std::size_t longest = 0;
  for (std::size_t r = 0; r * fields < all.size(); ++r) {
    every = every && all[r * fields] == 1;
    for (std::size_t k = 1; k < 4; ++k)
      same = same && all[r * fields + k] == all[k];
    longest = std::max(longest, static_cast<std::size_t>(all[r * fields + 4]));
  }
  std::shared_ptr<const measured_prices> taken;
  if (every && same) return found;
  if (every) {
    packed.resize(longest, 0.0f);
    taken = std::make_shared<const measured_prices>(unpack(gather_all(comm, packed).data()));
  } else {
    taken = std::make_shared<const measured_prices>(measure());
  }
  {
    auto& cache = measured();
    const std::lock_guard lock(cache.mutex);
    cache.prices.insert_or_assign(std::move(key), taken);
  }
  return taken;
}

/// The measured prices of C on comm (cached_prices); Vendor: the communicator's own collective
/// for float sums is measured beside weft's candidates. base: the communicator's table,
/// continued at the large sizes; none: the first sizes.
template <collective C, bool Vendor, class Comm>
WEFT_COLD std::shared_ptr<const measured_prices> measured_prices_for(
    Comm& comm, bool peer_access, bool messages, const measured_prices* base = nullptr) {
  return cached_prices(comm, C, peer_access, messages, Vendor, base, [&] {
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
  });
}

/// The measured prices of collective c on comm, without a vendor collective: what the local
/// transport measures where automatic picks by measured prices (local::options::automatic). One
/// function for every collective, so that a program compiles the measurement once. base: the
/// communicator's table, continued at the large sizes; none: the first sizes.
template <class Comm>
std::shared_ptr<const measured_prices> measure_collective(Comm& comm, collective c,
                                                          bool peer_access, bool messages,
                                                          const measured_prices* base) {
  return cached_prices(comm, c, peer_access, messages, false, base, [&] {
    return measure_prices(comm, c, peer_access, messages, no_vendor{}, base);
  });
}

} // namespace detail

} // namespace weft
