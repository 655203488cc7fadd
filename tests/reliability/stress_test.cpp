// Stress: 10,000 random collectives (operation, algorithm, size, element type, reduction,
// root, communicator split) on 8 ranks of the local transport in 2 emulated nodes, every
// result checked against a serial reference computed here from the inputs of all ranks.
//
//   WEFT_STRESS_SEED=<n>|time   the seed (default 20261130, fixed for CI; "time": from the clock)
//   WEFT_STRESS_OPS=<n>         how many collectives (default 10000)
//
// Every rank draws the same random sequence, so they make the same calls; a failure prints
// the seed and the call, and the same seed reproduces it.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/pairwise.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace std::chrono_literals;
using weft::collective;

using algorithms =
    std::tuple<weft::algo::automatic, weft::algo::ring, weft::algo::tree,
               weft::algo::halving_doubling, weft::algo::recursive_doubling, weft::algo::direct,
               weft::algo::pairwise, weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>>;
constexpr std::size_t algorithm_count = std::tuple_size_v<algorithms>;
constexpr std::array<collective, 6> collectives = {
    collective::all_reduce, collective::reduce_scatter, collective::all_gather,
    collective::broadcast,  collective::reduce,         collective::all_to_all};

template <std::size_t... I>
std::vector<std::size_t> serving(collective c, std::index_sequence<I...>) {
  std::vector<std::size_t> v;
  ((std::tuple_element_t<I, algorithms>::serves(c) ? v.push_back(I) : void()), ...);
  return v;
}

enum class reduction { sum, prod, min, max };
enum class element { int32, int64, float32, float64 };

struct call {
  collective coll = collective::all_reduce;
  std::size_t algorithm = 0;
  element type = element::int32;
  reduction op = reduction::sum;
  std::size_t count = 0;
  int root_draw = 0;

  [[nodiscard]] std::string to_string(int iteration, int size) const {
    static constexpr const char* types[] = {"int32", "int64", "float32", "float64"};
    static constexpr const char* ops[] = {"sum", "prod", "min", "max"};
    static constexpr const char* algos[] = {
        "automatic",          "ring",   "tree",     "halving_doubling",
        "recursive_doubling", "direct", "pairwise", "hierarchical<ring,tree>"};
    return "call " + std::to_string(iteration) + ": " + std::string(weft::name_of(coll)) + "<" +
           algos[algorithm] + "> of " + std::to_string(count) + " x " +
           types[static_cast<int>(type)] + ", op " + ops[static_cast<int>(op)] + ", root " +
           std::to_string(root_draw % size) + ", on " + std::to_string(size) + " ranks";
  }
};

// Input element i of world rank w in call `it`: small integers, exact in every type and every
// reduction order; larger distinct values where nothing is reduced (misplacement shows).
std::int64_t input(int it, int w, std::size_t i, collective c, reduction op) {
  const auto h = static_cast<std::int64_t>(
      (static_cast<std::uint64_t>(it) * 5 + static_cast<std::uint64_t>(w) * 7 + i * 13) % 1000003);
  if (c == collective::all_gather || c == collective::broadcast || c == collective::all_to_all) {
    return (h * 31 + w * 1009) % 100000;
  }
  switch (op) {
    case reduction::sum: return h % 7 - 3;
    case reduction::prod: return h % 3 == 0 ? -1 : 1;
    case reduction::min:
    case reduction::max: return h % 11 - 5;
  }
  return 0;
}

std::int64_t combine(reduction op, std::int64_t a, std::int64_t b) {
  switch (op) {
    case reduction::sum: return a + b;
    case reduction::prod: return a * b;
    case reduction::min: return std::min(a, b);
    case reduction::max: return std::max(a, b);
  }
  return 0;
}

// The serial reference: what rank `me` (of `members`, world ranks in communicator order)
// must hold after the call; empty where its output is unspecified.
std::vector<std::int64_t> expected(const call& k, int it, const std::vector<int>& members, int me) {
  const auto p = static_cast<std::size_t>(members.size());
  const std::size_t n = k.count;
  const int root = k.root_draw % static_cast<int>(p);
  const auto in = [&](std::size_t m, std::size_t i) {
    return input(it, members[m], i, k.coll, k.op);
  };
  const auto reduced = [&](std::size_t i) {
    std::int64_t acc = in(0, i);
    for (std::size_t m = 1; m < p; ++m)
      acc = combine(k.op, acc, in(m, i));
    return acc;
  };
  std::vector<std::int64_t> out;
  switch (k.coll) {
    case collective::all_reduce:
      for (std::size_t i = 0; i < n; ++i)
        out.push_back(reduced(i));
      break;
    case collective::reduce_scatter:
      for (std::size_t i = 0; i < n; ++i)
        out.push_back(reduced(static_cast<std::size_t>(me) * n + i));
      break;
    case collective::all_gather:
      for (std::size_t s = 0; s < p; ++s) {
        for (std::size_t i = 0; i < n; ++i)
          out.push_back(in(s, i));
      }
      break;
    case collective::broadcast:
      for (std::size_t i = 0; i < n; ++i)
        out.push_back(in(static_cast<std::size_t>(root), i));
      break;
    case collective::reduce:
      if (me == root) {
        for (std::size_t i = 0; i < n; ++i)
          out.push_back(reduced(i));
      }
      break;
    case collective::all_to_all:
      for (std::size_t s = 0; s < p; ++s) {
        for (std::size_t i = 0; i < n; ++i)
          out.push_back(in(s, static_cast<std::size_t>(me) * n + i));
      }
      break;
  }
  return out;
}

template <collective Coll, class Algo, class T, class Op>
void run_call(weft::local::communicator& c, const call& k, int it, int world_rank,
              std::vector<T>& out) {
  const auto p = static_cast<std::size_t>(c.size());
  const std::size_t n = k.count;
  const int root = k.root_draw % c.size();
  const bool blocks_in = k.coll == collective::reduce_scatter || k.coll == collective::all_to_all;
  std::vector<T> in(blocks_in ? n * p : n);
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<T>(input(it, world_rank, i, k.coll, k.op));
  const bool blocks_out = k.coll == collective::all_gather || k.coll == collective::all_to_all;
  out.assign(blocks_out ? n * p : n, T{});
  const Op op{};
  if constexpr (Coll == collective::all_reduce) {
    if (it % 2 == 0) {
      out = in; // in place
      weft::all_reduce<Algo>(c, std::span(out), op);
    } else {
      weft::all_reduce<Algo>(c, std::span<const T>(in), std::span(out), op);
    }
  } else if constexpr (Coll == collective::reduce_scatter) {
    weft::reduce_scatter<Algo>(c, std::span<const T>(in), std::span(out), op);
  } else if constexpr (Coll == collective::all_gather) {
    weft::all_gather<Algo>(c, std::span<const T>(in), std::span(out));
  } else if constexpr (Coll == collective::broadcast) {
    if (c.rank() == root) out = in;
    weft::broadcast<Algo>(c, std::span(out), root);
  } else if constexpr (Coll == collective::reduce) {
    weft::reduce<Algo>(c, std::span<const T>(in), std::span(out), root, op);
  } else {
    weft::all_to_all<Algo>(c, std::span<const T>(in), std::span(out));
  }
}

// Operations that reduce nothing are compiled for one operator only.
constexpr bool reduces(collective c) {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}

template <std::size_t I = 0, class T, class Op>
void by_algorithm(weft::local::communicator& c, const call& k, int it, int w, std::vector<T>& out) {
  if constexpr (I < algorithm_count) {
    using A = std::tuple_element_t<I, algorithms>;
    if (k.algorithm == I) {
      bool done = false;
      [&]<std::size_t... C>(std::index_sequence<C...>) {
        ((!done && k.coll == collectives[C]
              ? (done = true,
                 [&] {
                   if constexpr ((std::is_same_v<A, weft::algo::automatic> ||
                                  A::serves(collectives[C])) &&
                                 (reduces(collectives[C]) || std::is_same_v<Op, weft::op::sum>)) {
                     run_call<collectives[C], A, T, Op>(c, k, it, w, out);
                   }
                 }())
              : void()),
         ...);
      }
      (std::make_index_sequence<collectives.size()>{});
      return;
    }
    by_algorithm<I + 1, T, Op>(c, k, it, w, out);
  }
}

template <class T>
void by_op(weft::local::communicator& c, const call& k, int it, int w, std::vector<T>& out) {
  if (!reduces(k.coll)) return by_algorithm<0, T, weft::op::sum>(c, k, it, w, out);
  switch (k.op) {
    case reduction::sum: by_algorithm<0, T, weft::op::sum>(c, k, it, w, out); break;
    case reduction::prod: by_algorithm<0, T, weft::op::prod>(c, k, it, w, out); break;
    case reduction::min: by_algorithm<0, T, weft::op::min>(c, k, it, w, out); break;
    case reduction::max: by_algorithm<0, T, weft::op::max>(c, k, it, w, out); break;
  }
}

template <class T>
bool matches(const std::vector<T>& got, const std::vector<std::int64_t>& want, std::string& why) {
  if (got.size() < want.size()) {
    why = "output of " + std::to_string(got.size()) + " elements, expected " +
          std::to_string(want.size());
    return false;
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (static_cast<std::int64_t>(got[i]) != want[i] || static_cast<T>(want[i]) != got[i]) {
      why = "element " + std::to_string(i) + " is " +
            std::to_string(static_cast<std::int64_t>(got[i])) + ", expected " +
            std::to_string(want[i]);
      return false;
    }
  }
  return true;
}

std::uint64_t seed_from_env() {
  const char* s = std::getenv("WEFT_STRESS_SEED");
  if (s == nullptr || *s == '\0') return 20261130;
  if (std::string(s) == "time") {
    return static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  return std::strtoull(s, nullptr, 10);
}

int ops_from_env() {
  const char* s = std::getenv("WEFT_STRESS_OPS");
  return s == nullptr || *s == '\0' ? 10000 : std::atoi(s);
}

TEST(stress, random_collectives_on_8_ranks_match_the_serial_reference) {
  const std::uint64_t seed = seed_from_env();
  const int ops = ops_from_env();
  const auto cluster = weft::topology::parse("2x4");
  constexpr int p = 8;
  std::vector<std::vector<std::size_t>> serves;
  for (collective c : collectives)
    serves.push_back(serving(c, std::make_index_sequence<algorithm_count>{}));
  std::atomic<int> mismatches{0};
  std::atomic<long> checked{0};
  std::array<std::atomic<int>, collectives.size()> per_op{};
  const auto start = std::chrono::steady_clock::now();
  weft::local::run(
      cluster,
      [&](weft::local::communicator& world) {
        std::mt19937_64 rng(seed); // the same on every rank: the same calls
        std::optional<weft::local::communicator> sub;
        std::vector<int> members; // world ranks of my communicator, in its order
        const int w = world.rank();
        for (int it = 0; it < ops; ++it) {
          if (it % 250 == 0) { // a new layout: the world, or a split into 2..4 colors
            const int colors = static_cast<int>(rng() % 4) + 1;
            std::array<int, p> color{};
            std::array<int, p> key{};
            for (int r = 0; r < p; ++r) {
              color[static_cast<std::size_t>(r)] =
                  static_cast<int>(rng() % static_cast<unsigned>(colors));
              key[static_cast<std::size_t>(r)] = static_cast<int>(rng() % 5);
            }
            sub.emplace(
                world.split(color[static_cast<std::size_t>(w)], key[static_cast<std::size_t>(w)]));
            std::vector<std::pair<int, int>> order;
            for (int r = 0; r < p; ++r) {
              if (color[static_cast<std::size_t>(r)] == color[static_cast<std::size_t>(w)]) {
                order.emplace_back(key[static_cast<std::size_t>(r)], r);
              }
            }
            std::sort(order.begin(), order.end());
            members.clear();
            for (auto [kk, r] : order)
              members.push_back(r);
          }
          call k;
          const auto ci = static_cast<std::size_t>(rng() % collectives.size());
          k.coll = collectives[ci];
          const auto& algos = serves[ci];
          k.algorithm = algos[static_cast<std::size_t>(rng() % algos.size())];
          k.type = static_cast<element>(rng() % 4);
          k.op = static_cast<reduction>(rng() % 4);
          const auto size_class = rng() % 20;
          k.count = static_cast<std::size_t>(size_class < 14   ? rng() % 65
                                             : size_class < 19 ? rng() % 1024
                                                               : rng() % 4096);
          k.root_draw = static_cast<int>(rng() % 840); // divisible by every size: uniform roots
          auto& c = *sub;
          const int me = c.rank();
          const auto want = expected(k, it, members, me);
          std::string why;
          bool ok = true;
          switch (k.type) {
            case element::int32: {
              std::vector<std::int32_t> out;
              by_op(c, k, it, w, out);
              ok = matches(out, want, why);
              break;
            }
            case element::int64: {
              std::vector<std::int64_t> out;
              by_op(c, k, it, w, out);
              ok = matches(out, want, why);
              break;
            }
            case element::float32: {
              std::vector<float> out;
              by_op(c, k, it, w, out);
              ok = matches(out, want, why);
              break;
            }
            case element::float64: {
              std::vector<double> out;
              by_op(c, k, it, w, out);
              ok = matches(out, want, why);
              break;
            }
          }
          checked.fetch_add(1, std::memory_order_relaxed);
          if (me == 0) per_op[ci].fetch_add(1, std::memory_order_relaxed);
          if (!ok && mismatches.fetch_add(1) < 10) {
            ADD_FAILURE() << "seed " << seed << ", world rank " << w << " (rank " << me << "), "
                          << k.to_string(it, c.size()) << ": " << why;
          }
        }
      },
      {.timeout = 120s});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(mismatches.load(), 0) << "seed " << seed;
  EXPECT_EQ(checked.load(), static_cast<long>(ops) * p);
  std::string mix;
  for (std::size_t i = 0; i < collectives.size(); ++i) {
    mix +=
        " " + std::string(weft::name_of(collectives[i])) + "=" + std::to_string(per_op[i].load());
  }
  std::printf(
      "stress: seed %llu, %d calls x 8 ranks checked in %.2f s (%.0f us per call); calls per "
      "sub-communicator "
      "and operation:%s\n",
      static_cast<unsigned long long>(seed), ops, s, 1e6 * s / ops, mix.c_str());
}

} // namespace
