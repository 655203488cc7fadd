#pragma once
// What the tests of the plan generators (tests/comm/algorithm/) share: a generator's plan for
// one rank, the collectives it serves, its plans checked at a given element size, and counts
// of what a plan sends. The references are those of reference.hpp.
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/plan.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace weft::test {

/// Algo's plan for rank r of p: collective c of count elements from root, with elements of
/// element_size bytes. An object, so that a test names it `make` once and calls it with the
/// defaults: `constexpr planner<algo::ring> make;`.
template <class Algo>
struct planner {
  plan operator()(collective c, int p, int r, std::size_t count, int root = 0,
                  std::size_t element_size = 4) const {
    return Algo::make_plan(plan_request{c, p, r, count, root, {}, element_size});
  }
};

inline constexpr collective every_collective[] = {
    collective::all_reduce, collective::reduce_scatter, collective::all_gather,
    collective::broadcast,  collective::reduce,         collective::all_to_all};

/// Whether Algo is a plan generator that serves the collectives in `served` and no other
/// (for static_assert).
template <class Algo>
consteval bool serves_exactly(std::span<const collective> served) {
  if constexpr (!algo::plan_generator<Algo>) {
    return false;
  } else {
    for (collective c : every_collective) {
      bool listed = false;
      for (collective s : served)
        listed = listed || s == c;
      if (Algo::serves(c) != listed) return false;
    }
    return true;
  }
}

/// Counts around p's edges: none, one, p - 1, p + 3 (uneven blocks) and a larger one.
inline std::vector<std::size_t> counts_for(int p) {
  return {0, 1, static_cast<std::size_t>(p - 1), static_cast<std::size_t>(p + 3), 3000};
}

/// Elements a plan sends, in all.
inline std::size_t elements_sent(const plan& pl) {
  std::size_t n = 0;
  for (const auto& s : pl.steps())
    n += s.kind == step_kind::send ? s.count : 0;
  return n;
}

/// Elements a plan receives (reduced in or not), in all.
inline std::size_t elements_received(const plan& pl) {
  std::size_t n = 0;
  for (const auto& s : pl.steps())
    n += s.kind == step_kind::recv || s.kind == step_kind::recv_reduce ? s.count : 0;
  return n;
}

/// The peers of a plan's sends, in order.
inline std::vector<int> send_peers(const plan& pl) {
  std::vector<int> v;
  for (const auto& s : pl.steps()) {
    if (s.kind == step_kind::send) v.push_back(s.peer);
  }
  return v;
}

/// check_plans, for plans built with a given element_size: a large element size makes the
/// plans cut small counts into many chunks, which check_plans (4-byte requests) never sees.
template <class Algo, class T, class Op = op::sum>
void check_chunked(collective c, int p, std::size_t count, int root, std::size_t element_size,
                   pattern pat = pattern::exact) {
  SCOPED_TRACE(std::string(Algo::name) + " " + std::string(name_of(c)) + " p=" + std::to_string(p) +
               " count=" + std::to_string(count) + " root=" + std::to_string(root) +
               " element_size=" + std::to_string(element_size));
  std::vector<plan> plans;
  for (int r = 0; r < p; ++r)
    plans.push_back(planner<Algo>{}(c, p, r, count, root, element_size));
  check_plan_set<T, Op>(plans, c, count, root, pat, {0, 3});
}

/// The names the generators' tests use: `using namespace weft::test::plan_testing;`.
namespace plan_testing {
using weft::buffer, weft::collective, weft::plan, weft::plan_request, weft::step_kind;
using weft::test::elements_sent, weft::test::elements_received, weft::test::send_peers;
using weft::test::pattern, weft::test::check_plans, weft::test::check_chunked, weft::test::planner,
    weft::test::serves_exactly, weft::test::counts_for;
} // namespace plan_testing

} // namespace weft::test
