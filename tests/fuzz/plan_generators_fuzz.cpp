// libFuzzer target: the plan generators. The input picks a request (collective, algorithm,
// world size, count, root, element size, a node layout, an operator) and an interleaving; the
// target builds every rank's plan, runs them all on the abstract serial model (which checks
// bounds, message sizes, sends changed before they are consumed, and deadlock) and compares
// each rank's output with a reference computed here. A generator may refuse a request it
// does not serve only with a weft::error; every plan it makes must run and be right.
//
//   byte 0 collective   1 algorithm   2 world size - 1 (mod 24)   3-4 count (mod 600)
//   5 root              6 element size   7 operator   8 node count (0: one node)
//   9.. node of each rank, then the seed of the model's interleaving
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/pairwise.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/detail/serial_model.hpp>
#include <weft/core/ops.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using weft::collective;
using weft::plan;
using weft::plan_request;

struct generator {
  const char* name;
  bool (*serves)(collective);
  plan (*make)(const plan_request&);
};

template <class A>
generator entry() {
  return {A::name.data(), &A::serves, &A::make_plan};
}

const std::vector<generator>& generators() {
  static const std::vector<generator> all = {
      entry<weft::algo::automatic>(),
      entry<weft::algo::ring>(),
      entry<weft::algo::tree>(),
      entry<weft::algo::halving_doubling>(),
      entry<weft::algo::recursive_doubling>(),
      entry<weft::algo::direct>(),
      entry<weft::algo::pairwise>(),
      entry<weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>>(),
      entry<weft::algo::hierarchical<weft::algo::halving_doubling, weft::algo::ring>>(),
      entry<weft::algo::hierarchical<weft::algo::direct, weft::algo::recursive_doubling>>(),
  };
  return all;
}

enum class reduction { sum, prod, min, max };

std::string describe(const plan_request& q, const generator& g, reduction op) {
  std::string s = std::string(weft::name_of(q.coll)) + "<" + g.name +
                  "> p=" + std::to_string(q.size) + " count=" + std::to_string(q.count) +
                  " root=" + std::to_string(q.root) +
                  " element_size=" + std::to_string(q.element_size) +
                  " op=" + std::to_string(static_cast<int>(op)) + " node_of=[";
  for (int n : q.node_of)
    s += std::to_string(n) + ",";
  return s + "]";
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "plan_generators_fuzz: %s\n", what.c_str());
  std::abort();
}

// Small integers whose reductions are exact in any order (no overflow of int64 either).
std::int64_t value(int r, std::size_t i, reduction op, bool reduces) {
  const auto h = static_cast<std::int64_t>((static_cast<std::size_t>(r) * 7 + i * 13) % 101);
  if (!reduces) return r * 100000 + static_cast<std::int64_t>(i);
  switch (op) {
    case reduction::sum: return h % 9 - 4;
    case reduction::prod: return h % 3 == 0 ? -1 : 1;
    default: return h - 50;
  }
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

template <class Op>
void run_model(const std::vector<plan>& plans,
               std::vector<weft::detail::model_rank<std::int64_t>>& ranks, std::uint64_t seed) {
  weft::detail::run_serial(plans, ranks, Op{}, seed);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 9) return 0;
  const auto& gens = generators();
  const auto coll = static_cast<collective>(data[0] % 6);
  const generator& g = gens[data[1] % gens.size()];
  if (!g.serves(coll)) return 0;
  const int p = 1 + data[2] % 24;
  const std::size_t count =
      (static_cast<std::size_t>(data[3]) | static_cast<std::size_t>(data[4]) << 8) % 600;
  const int root = data[5] % p;
  static constexpr std::size_t element_sizes[] = {1, 2, 4, 8};
  const std::size_t element_size = element_sizes[data[6] % 4];
  const auto op = static_cast<reduction>(data[7] % 4);
  const int nodes = data[8] % 5; // 0: no layout (one node)
  std::size_t at = 9;
  std::vector<int> node_of;
  if (nodes > 0) {
    for (int r = 0; r < p; ++r)
      node_of.push_back(at < size ? data[at++] % nodes : r % nodes);
    // A layout names nodes 0..k-1, each with a rank: renumber in order of first appearance.
    std::vector<int> rename(static_cast<std::size_t>(nodes), -1);
    int next = 0;
    for (int& n : node_of) {
      auto& to = rename[static_cast<std::size_t>(n)];
      if (to < 0) to = next++;
      n = to;
    }
  }
  std::uint64_t seed = 0;
  for (; at < size; ++at)
    seed = seed * 131 + data[at];

  const bool reduces = coll == collective::all_reduce || coll == collective::reduce_scatter ||
                       coll == collective::reduce;
  const bool blocks_in = coll == collective::reduce_scatter || coll == collective::all_to_all;
  const bool blocks_out = coll == collective::all_gather || coll == collective::all_to_all;
  const auto P = static_cast<std::size_t>(p);
  std::vector<plan> plans;
  plan_request q{coll, p, 0, count, root, node_of, element_size};
  for (int r = 0; r < p; ++r) {
    q.rank = r;
    try {
      plans.push_back(g.make(q));
    } catch (const weft::error& e) {
      // A refusal must be the same on every rank and say what is wrong; one rank refusing
      // what another accepted is a bug.
      if (r != 0)
        fail("rank " + std::to_string(r) + " refused what rank 0 accepted: " + describe(q, g, op) +
             ": " + e.what());
      return 0;
    }
    const plan& pl = plans.back();
    if (pl.rank() != r || pl.size() != p || pl.count() != count || pl.coll() != coll) {
      fail("plan header does not match its request: " + describe(q, g, op) + "\n" + pl.to_string());
    }
  }
  std::vector<weft::detail::model_rank<std::int64_t>> ranks(P);
  for (int r = 0; r < p; ++r) {
    auto& m = ranks[static_cast<std::size_t>(r)];
    m.input.resize(blocks_in ? count * P : count);
    for (std::size_t i = 0; i < m.input.size(); ++i)
      m.input[i] = value(r, i, op, reduces);
    const bool has_out = coll != collective::reduce || r == root;
    m.output.assign(blocks_out ? count * P : (has_out ? count : 0), -7);
    if (coll == collective::all_reduce && (seed & 1) != 0) { // in place: input aliases output
      m.in_place = true;
      m.output = m.input;
    }
    if (coll == collective::broadcast) {
      m.in_place = true;
      m.output = r == root ? m.input : std::vector<std::int64_t>(count, -7);
    }
  }
  try {
    switch (op) {
      case reduction::sum: run_model<weft::op::sum>(plans, ranks, seed); break;
      case reduction::prod: run_model<weft::op::prod>(plans, ranks, seed); break;
      case reduction::min: run_model<weft::op::min>(plans, ranks, seed); break;
      case reduction::max: run_model<weft::op::max>(plans, ranks, seed); break;
    }
  } catch (const weft::error& e) {
    fail("the plans do not run on the model: " + describe(q, g, op) + ": " + e.what());
  }
  const auto in = [&](std::size_t r, std::size_t i) {
    return value(static_cast<int>(r), i, op, reduces);
  };
  for (std::size_t r = 0; r < P; ++r) {
    std::vector<std::int64_t> want;
    const auto reduced = [&](std::size_t i) {
      std::int64_t acc = in(0, i);
      for (std::size_t s = 1; s < P; ++s)
        acc = combine(op, acc, in(s, i));
      return acc;
    };
    switch (coll) {
      case collective::all_reduce:
        for (std::size_t i = 0; i < count; ++i)
          want.push_back(reduced(i));
        break;
      case collective::reduce_scatter:
        for (std::size_t i = 0; i < count; ++i)
          want.push_back(reduced(r * count + i));
        break;
      case collective::all_gather:
        for (std::size_t s = 0; s < P; ++s) {
          for (std::size_t i = 0; i < count; ++i)
            want.push_back(in(s, i));
        }
        break;
      case collective::broadcast:
        for (std::size_t i = 0; i < count; ++i)
          want.push_back(in(static_cast<std::size_t>(root), i));
        break;
      case collective::reduce:
        if (r == static_cast<std::size_t>(root)) {
          for (std::size_t i = 0; i < count; ++i)
            want.push_back(reduced(i));
        }
        break;
      case collective::all_to_all:
        for (std::size_t s = 0; s < P; ++s) {
          for (std::size_t i = 0; i < count; ++i)
            want.push_back(in(s, r * count + i));
        }
        break;
    }
    const auto& got = ranks[r].output;
    if (got.size() < want.size() || !std::equal(want.begin(), want.end(), got.begin())) {
      std::size_t i = 0;
      while (i < want.size() && i < got.size() && got[i] == want[i])
        ++i;
      fail("rank " + std::to_string(r) + " output differs from the reference at element " +
           std::to_string(i) + ": " + describe(q, g, op) + "\n" + plans[r].to_string());
    }
  }
  return 0;
}
