#pragma once
// Gloo (the collectives library behind PyTorch's CPU backend; Debian's libgloo-dev) as a peer
// of weft in the benchmarks: its float-sum all-reduce algorithms with threads as ranks, over
// its TCP transport on loopback, the way a CPU job without MPI would all-reduce.
//
//   weft::bench::gloo::gloo_group g(4);          // 4 ranks, each a gloo context, connected once
//   double s = g.time_all_reduce(algorithm::ring, count, 20);   // seconds per call
//   bool ok = g.check_all_reduce(algorithm::ring, count);       // against a plain loop
//
// Link the CMake target weft_bench_gloo. Where Gloo was not found it compiles to nothing but
// `available == false`, so a suite tests `#if WEFT_BENCH_HAVE_GLOO` (or `available`) and
// builds either way.
//
// Set-up (the TCP full mesh between the ranks) is done once in the constructor and reused for
// every size; an algorithm object is built per call of time_all_reduce (buffers registered
// with the transport) and is not timed either.

namespace weft::bench::gloo {
#if defined(WEFT_BENCH_HAVE_GLOO) && WEFT_BENCH_HAVE_GLOO
inline constexpr bool available = true;
#else
inline constexpr bool available = false;
#endif
} // namespace weft::bench::gloo

#if defined(WEFT_BENCH_HAVE_GLOO) && WEFT_BENCH_HAVE_GLOO

#include <weft/core/error.hpp>

#include <gloo/algorithm.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/config.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#if !GLOO_HAVE_TRANSPORT_TCP
#error "this Gloo was built without its TCP transport, which the Gloo peer uses"
#endif

namespace weft::bench::gloo {

/// Gloo's all-reduce algorithms (all in place, on one float array per rank):
///   ring              AllreduceRing: p-1 steps, each passing the whole vector to the right
///                     neighbour and adding what came from the left (no reduce-scatter phase)
///   ring_chunked      AllreduceRingChunked: the vector in 2p chunks, reduce-scatter then
///                     all-gather around the ring, two chunks in flight
///   halving_doubling  AllreduceHalvingDoubling: recursive halving reduce-scatter, then
///                     recursive doubling all-gather (non-powers of two in binary blocks)
enum class algorithm { ring, ring_chunked, halving_doubling };

inline constexpr std::array<algorithm, 3> all_algorithms{algorithm::ring, algorithm::ring_chunked,
                                                         algorithm::halving_doubling};

[[nodiscard]] constexpr std::string_view name(algorithm a) noexcept {
  switch (a) {
    case algorithm::ring: return "ring";
    case algorithm::ring_chunked: return "ring_chunked";
    case algorithm::halving_doubling: return "halving_doubling";
  }
  return "?";
}

struct options {
  /// Where the TCP device listens. A numeric loopback address needs no name resolution and
  /// keeps the traffic off any real interface.
  std::string hostname = "127.0.0.1";
  /// One TCP device (one listening socket, one event-loop thread) per rank, as separate
  /// processes would have, instead of one shared by all ranks (as Gloo's own tests do).
  /// Shared is the default: on a 2-core machine the extra event-loop threads compete with the
  /// ranks, and shared was faster at nearly every size measured (up to 4x below 64 KiB).
  bool device_per_rank = false;
  /// Gloo's own deadline on every wait; a rank that fails makes the others fail after it.
  std::chrono::milliseconds timeout{60'000};
};

namespace detail {

// Small integers: every order of summation gives the exact float answer.
inline float check_input(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 13) % 11) -
                            5);
}

inline std::unique_ptr<::gloo::Algorithm> make(algorithm a,
                                               const std::shared_ptr<::gloo::Context>& context,
                                               float* data, int count) {
  const std::vector<float*> ptrs{data};
  switch (a) {
    case algorithm::ring:
      return std::make_unique<::gloo::AllreduceRing<float>>(context, ptrs, count);
    case algorithm::ring_chunked:
      return std::make_unique<::gloo::AllreduceRingChunked<float>>(context, ptrs, count);
    case algorithm::halving_doubling:
      return std::make_unique<::gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
  }
  throw weft::error("weft::bench::gloo: unknown algorithm");
}

} // namespace detail

/// `ranks` Gloo contexts, one per thread-rank, connected to each other once over TCP.
/// Not thread-safe: one call at a time (each call runs its own threads, one per rank).
class gloo_group {
public:
  explicit gloo_group(int ranks, options opt = {}) : ranks_(ranks), opt_(std::move(opt)) {
    WEFT_EXPECTS(ranks >= 1, "a gloo_group needs at least one rank");
    ::gloo::transport::tcp::attr attr;
    attr.hostname = opt_.hostname;
    // Gloo 0.5's CreateDevice crashes (SIGSEGV) on a name that does not resolve instead of
    // throwing, so the name is resolved here first.
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(opt_.hostname.c_str(), nullptr, nullptr, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (rc != 0) {
      throw weft::error("gloo TCP device", error::unknown, error::unknown,
                        "cannot resolve '" + opt_.hostname + "': " + ::gai_strerror(rc));
    }
    try {
      const int devices = opt_.device_per_rank ? ranks : 1;
      for (int d = 0; d < devices; ++d)
        devices_.push_back(::gloo::transport::tcp::CreateDevice(attr));
    } catch (const std::exception& e) {
      throw weft::error("gloo TCP device", error::unknown, error::unknown,
                        "cannot listen on " + opt_.hostname + ": " + e.what());
    }
    contexts_.resize(static_cast<std::size_t>(ranks));
    // The in-process store is only the rendezvous (each rank publishes its listening address);
    // the data then goes over the sockets.
    ::gloo::rendezvous::HashStore store;
    on_ranks("gloo connectFullMesh", [&](int r, std::barrier<>&) {
      auto context = std::make_shared<::gloo::rendezvous::Context>(r, ranks_);
      context->setTimeout(opt_.timeout);
      context->connectFullMesh(store,
                               devices_[opt_.device_per_rank ? static_cast<std::size_t>(r) : 0]);
      contexts_[static_cast<std::size_t>(r)] = std::move(context);
    });
  }

  gloo_group(const gloo_group&) = delete;
  gloo_group& operator=(const gloo_group&) = delete;

  [[nodiscard]] int size() const noexcept { return ranks_; }
  [[nodiscard]] const options& settings() const noexcept { return opt_; }

  /// Seconds per in-place float-sum all-reduce of `count` elements per rank: after one untimed
  /// warm-up call, `repetitions` runs of `iterations` back-to-back calls, each run started on
  /// all ranks at once (a barrier) and timed by its slowest rank; the best run's mean.
  /// The buffers hold zeros, which stay zeros: repeated in-place sums cannot overflow.
  double time_all_reduce(algorithm a, std::size_t count, int iterations, int repetitions = 3) {
    WEFT_EXPECTS(iterations >= 1 && repetitions >= 1,
                 "iterations and repetitions must be positive");
    const int n = checked_count(count);
    // seconds[rep][rank]: each thread writes its own slots, read after on_ranks joined them all.
    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(repetitions),
                                             std::vector<double>(static_cast<std::size_t>(ranks_)));
    on_ranks(operation(a), [&](int r, std::barrier<>& sync) {
      std::vector<float> data(count, 0.0f);
      auto algo = detail::make(a, contexts_[static_cast<std::size_t>(r)], data.data(), n);
      algo->run();
      for (int rep = 0; rep < repetitions; ++rep) {
        sync.arrive_and_wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i)
          algo->run();
        seconds[static_cast<std::size_t>(rep)][static_cast<std::size_t>(r)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
            iterations;
      }
      // Nobody frees a buffer that a slower rank's last call may still be using.
      sync.arrive_and_wait();
    });
    double best = 1e300;
    for (const auto& run : seconds)
      best = std::min(best, *std::max_element(run.begin(), run.end()));
    return best;
  }

  /// Elements (over all ranks) where one all-reduce of `count` small integers per rank differs
  /// from the sum computed by a plain loop; 0 means Gloo's answer is right on every rank.
  std::size_t count_wrong_all_reduce(algorithm a, std::size_t count) {
    const int n = checked_count(count);
    std::atomic<std::size_t> wrong{0};
    on_ranks(operation(a), [&](int r, std::barrier<>& sync) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = detail::check_input(r, i);
      auto algo = detail::make(a, contexts_[static_cast<std::size_t>(r)], data.data(), n);
      algo->run();
      sync.arrive_and_wait();
      std::size_t mine = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < ranks_; ++q)
          want += detail::check_input(q, i);
        mine += data[i] == want ? 0 : 1;
      }
      wrong += mine;
    });
    return wrong.load();
  }

  /// Whether one all-reduce of `count` elements per rank gives the exact sum on every rank.
  bool check_all_reduce(algorithm a, std::size_t count) {
    return count_wrong_all_reduce(a, count) == 0;
  }

private:
  static std::string operation(algorithm a) { return "gloo all_reduce " + std::string(name(a)); }

  static int checked_count(std::size_t count) {
    // Gloo's algorithms take the count as an int.
    WEFT_EXPECTS(count <= static_cast<std::size_t>(INT_MAX), "Gloo counts elements in an int");
    return static_cast<int>(count);
  }

  // Runs f(rank, barrier) on one thread per rank and rethrows the first failure as a
  // weft::error naming the rank. A failing rank leaves the barrier (arrive_and_drop) so the
  // others are not stuck in it; they then fail on Gloo's own timeout instead of hanging.
  template <class F>
  void on_ranks(const std::string& what, F&& f) {
    std::barrier<> sync(ranks_);
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks_));
    std::atomic<int> first{-1};
    {
      std::vector<std::jthread> threads;
      threads.reserve(static_cast<std::size_t>(ranks_));
      for (int r = 0; r < ranks_; ++r) {
        threads.emplace_back([&, r] {
          try {
            f(r, sync);
          } catch (...) {
            errors[static_cast<std::size_t>(r)] = std::current_exception();
            int none = -1;
            first.compare_exchange_strong(none, r);
            sync.arrive_and_drop();
          }
        });
      }
    }
    const int r = first.load();
    if (r < 0) return;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const weft::error&) {
      throw;
    } catch (const std::exception& e) {
      throw weft::error(what, r, error::unknown, e.what());
    } catch (...) {
      throw weft::error(what, r, error::unknown, "unknown exception");
    }
  }

  int ranks_;
  options opt_;
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices_;
  std::vector<std::shared_ptr<::gloo::Context>> contexts_;
};

} // namespace weft::bench::gloo

#endif // WEFT_BENCH_HAVE_GLOO
