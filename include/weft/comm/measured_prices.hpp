#pragma once
// measured_prices: automatic's prices measured on this machine instead of the cost model's
// nominal figures, for a communicator that asks for them (weft::local on one host:
// local::options::measured_automatic). The cost model prices a plan over a link's latency
// and bandwidth; on one host the ranks' futex hand-offs, shared caches and memory bandwidth do
// not follow those figures (4 ranks on 2 cores: recursive doubling priced at 3.6 us runs in
// 13 us, direct priced at 5.3 us runs in 7.5 us), so the host's prices come from the host.
//
//   first automatic call of collective C on the communicator (every rank makes it):
//     agree whether this process has measured C for this group shape already
//       (cached per communicator type, collective, size, cluster and placement: once per
//       process)
//     else, for every candidate automatic may pick here, at 4 KiB, 16 KiB, ... 16 MiB per rank
//       (by factors of 4; fewer on large groups, so that the buffers stay within 256 MiB):
//         one untimed call, then the fastest of 20 timed calls (5 above 64 KiB, 3 above
//         1 MiB), each after a barrier;
//         the slowest rank's figure, gathered from every rank
//         past 64 KiB, no larger size once a call has taken over 20 ms (a slow machine, or
//         a sanitizer's build, measures less)
//     and the communicator's own collective (algo::vendor: MPI's, say) likewise, where it
//     has one for float sums: automatic then weighs the vendor by this measurement
//   every call: the candidate whose measured time, interpolated at the call's bytes, is least
//     (linear between measured sizes, the smallest size's time below them, the last
//     segment's slope above them; a tie goes to the earlier candidate)
//
// What it costs: at the first automatic call of each collective on a group shape, every
// candidate runs up to 80 times; on 4 ranks of this 2-core machine about 0.3 s for
// all_reduce. Every rank of the group must make that call (it is a collective, as the call
// is); weft::automatic_choice on such a communicator is collective at first use too.
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

/// The sizes measured, per rank; fewer where p ranks' buffers would pass 256 MiB.
inline std::vector<double> measured_sizes(collective c, int p) {
  const bool blocked =
      c == collective::reduce_scatter || c == collective::all_gather || c == collective::all_to_all;
  const double per_byte = 2.0 * p * (blocked ? p : 1); // input and output on every rank
  std::vector<double> out;
  for (double b = 4096; b <= 16777216; b *= 4)
    if (out.empty() || b * per_byte <= 256.0 * 1048576.0) out.push_back(b);
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
inline constexpr double measured_call_limit = 0.02;

/// Measures every eligible candidate for collective C on comm, all ranks together, and the
/// communicator's own collective for float sums where Vendor.
template <collective C, bool Vendor, class Comm>
WEFT_COLD measured_prices measure_prices(Comm& comm, bool peer_access, bool messages) {
  using clock = std::chrono::steady_clock;
  const int p = comm.size();
  const auto up = static_cast<std::size_t>(p);
  const bool blocks_in = C == collective::reduce_scatter || C == collective::all_to_all;
  const bool blocks_out = C == collective::all_gather || C == collective::all_to_all;
  measured_prices m;
  m.bytes = measured_sizes(C, p);
  const auto table = algo::candidates();
  m.seconds.assign(table.size(), {});
  std::vector<float> in, out;
  // Times run(count, in_n, out_n) at each size into `into`, while calls stay short.
  const auto measure = [&](std::vector<double>& into, const auto& run) {
    for (const double b : m.bytes) {
      if (b > measured_always_bytes && !into.empty() && into.back() > measured_call_limit) break;
      const auto count = static_cast<std::size_t>(b) / sizeof(float);
      const std::size_t in_n = count * (blocks_in ? up : 1);
      const std::size_t out_n = count * (blocks_out ? up : 1);
      in.assign(in_n, 1.0f);
      out.assign(out_n, 0.0f);
      // Interference only adds time: the fastest of many small calls is this machine's figure.
      const int timed = b <= 65536 ? 20 : b <= 1048576 ? 5 : 3;
      double fastest = std::numeric_limits<double>::infinity();
      for (int k = 0; k <= timed; ++k) {
        comm.barrier();
        const auto t0 = clock::now();
        run(count, in_n, out_n);
        const double t = std::chrono::duration<double>(clock::now() - t0).count();
        if (k > 0) fastest = std::min(fastest, t);
      }
      // The slowest rank's, the same on every rank: so are the sizes each rank measures next.
      const std::vector<float> all = gather_all(comm, static_cast<float>(fastest));
      into.push_back(static_cast<double>(*std::max_element(all.begin(), all.end())));
    }
  };
  for (std::size_t i = 0; i < table.size(); ++i) {
    const plan_request shape{C, p, comm.rank(), 1, 0, comm.node_of(), sizeof(float)};
    if (!eligible(table[i], shape, peer_access, messages)) continue;
    measure(m.seconds[i], [&](std::size_t count, std::size_t in_n, std::size_t out_n) {
      plan_request q = shape;
      q.count = count;
      const plan& pl = plan_cache::mine().get(table[i].name, q, table[i].make_plan);
      if constexpr (C == collective::broadcast) {
        comm.execute(pl, out.data(), out_n, out.data(), out_n, op::sum{}, "measure automatic");
      } else {
        comm.execute(pl, in.data(), in_n, out.data(), out_n, op::sum{}, "measure automatic");
      }
    });
  }
  if constexpr (Vendor) {
    measure(m.vendor, [&](std::size_t count, std::size_t in_n, std::size_t out_n) {
      const float* const src = C == collective::broadcast ? out.data() : in.data();
      comm.template vendor<C>(src, in_n, out.data(), out_n, count, 0, op::sum{});
    });
  }
  return m;
}

/// What this process has measured, by communicator type, collective, group size and placement.
/// Not by the cluster's figures: only a communicator whose links are the machine's own
/// measures (weft::local without emulated links), and its speed is the machine's whatever the
/// cluster says.
struct measured_cache {
  using key =
      std::tuple<std::type_index, int, int, std::vector<int>, std::vector<int>, bool, bool, bool>;
  std::mutex mutex;
  std::map<key, std::shared_ptr<const measured_prices>> prices;
};

inline measured_cache& measured() {
  static measured_cache cache;
  return cache;
}

/// The measured prices of C on comm: this process's, where every rank finds them, else
/// measured now (all ranks together) and kept. Vendor: its own collective too.
template <collective C, bool Vendor, class Comm>
WEFT_COLD std::shared_ptr<const measured_prices> measured_prices_for(Comm& comm, bool peer_access,
                                                                     bool messages) {
  measured_cache::key key{std::type_index(typeid(Comm)),
                          static_cast<int>(C),
                          comm.size(),
                          comm.node_of(),
                          comm.devices(),
                          peer_access,
                          messages,
                          Vendor};
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
  auto mine = std::make_shared<const measured_prices>(
      measure_prices<C, Vendor>(comm, peer_access, messages));
  {
    auto& cache = measured();
    const std::lock_guard lock(cache.mutex);
    cache.prices.try_emplace(std::move(key), mine);
  }
  return mine;
}

/// The measured prices of collective c on comm, as a collective's automatic call measures them
/// (measured_prices_for, without a vendor collective): what local::measured_automatic() hands
/// the local transport.
template <class Comm>
std::shared_ptr<const measured_prices> measure_collective(Comm& comm, collective c,
                                                          bool peer_access, bool messages) {
  switch (c) {
    case collective::all_reduce:
      return measured_prices_for<collective::all_reduce, false>(comm, peer_access, messages);
    case collective::reduce_scatter:
      return measured_prices_for<collective::reduce_scatter, false>(comm, peer_access, messages);
    case collective::all_gather:
      return measured_prices_for<collective::all_gather, false>(comm, peer_access, messages);
    case collective::broadcast:
      return measured_prices_for<collective::broadcast, false>(comm, peer_access, messages);
    case collective::reduce:
      return measured_prices_for<collective::reduce, false>(comm, peer_access, messages);
    case collective::all_to_all:
      return measured_prices_for<collective::all_to_all, false>(comm, peer_access, messages);
  }
  throw error("weft: measured automatic: no such collective (" +
              std::to_string(static_cast<int>(c)) + ")");
}

} // namespace detail

namespace local {

class communicator;

/// The opt-in for local::options::measured_automatic: automatic on one host picks by prices
/// measured on the machine (see the top of this header).
///   local::run(4, f, {.measured_automatic = local::measured_automatic()});
/// A template, so that only a program that opts in compiles the measurement.
template <class Comm = communicator>
[[nodiscard]] auto measured_automatic() noexcept {
  return &weft::detail::measure_collective<Comm>;
}

} // namespace local

} // namespace weft
