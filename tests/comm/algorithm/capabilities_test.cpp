// The capability table (comm/algorithm/capabilities.hpp) against what each algorithm's own
// documentation says it plans, written out here; the concepts that read the table; and user
// tags that declare their needs with the members `needs_peer_access` / `needs_messages`.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/comm/two_level.hpp>

#include <gtest/gtest.h>

#include <array>

namespace {

using namespace weft;
using c = collective;

constexpr std::array all = {c::all_reduce, c::reduce_scatter, c::all_gather,
                            c::broadcast,  c::reduce,         c::all_to_all};

// Each algorithm's collectives, from its header's description.
template <class A>
bool serves_exactly(std::initializer_list<c> expected) {
  bool ok = true;
  for (c x : all) {
    const bool want = std::find(expected.begin(), expected.end(), x) != expected.end();
    const bool got = algo::capabilities_of<A>.serves.contains(x);
    EXPECT_EQ(got, want) << A::name << " " << name_of(x);
    EXPECT_EQ(A::serves(x), want) << A::name << " " << name_of(x);
    ok = ok && got == want;
  }
  return ok;
}

TEST(capabilities, each_algorithm_serves_what_its_header_says) {
  EXPECT_TRUE(serves_exactly<algo::ring>(
      {c::all_reduce, c::reduce_scatter, c::all_gather, c::broadcast, c::reduce}));
  EXPECT_TRUE(serves_exactly<algo::tree>({c::all_reduce, c::broadcast, c::reduce}));
  EXPECT_TRUE(
      serves_exactly<algo::halving_doubling>({c::all_reduce, c::reduce_scatter, c::all_gather}));
  EXPECT_TRUE(serves_exactly<algo::recursive_doubling>({c::all_reduce}));
  EXPECT_TRUE(serves_exactly<algo::pairwise>({c::all_to_all}));
  EXPECT_TRUE(serves_exactly<algo::direct>(
      {c::all_reduce, c::reduce_scatter, c::all_gather, c::broadcast, c::reduce, c::all_to_all}));
  EXPECT_TRUE(serves_exactly<algo::automatic>(
      {c::all_reduce, c::reduce_scatter, c::all_gather, c::broadcast, c::reduce, c::all_to_all}));
  // Across the nodes a tree neither gathers nor scatters, so neither does the hierarchy; a
  // halving-doubling neither broadcasts nor reduces to a root.
  EXPECT_TRUE((serves_exactly<algo::hierarchical<algo::ring, algo::tree>>(
      {c::all_reduce, c::broadcast, c::reduce})));
  EXPECT_TRUE((serves_exactly<algo::hierarchical<algo::ring, algo::halving_doubling>>(
      {c::all_reduce, c::reduce_scatter, c::all_gather})));
  EXPECT_TRUE((serves_exactly<algo::hierarchical<algo::ring, algo::ring>>(
      {c::all_reduce, c::reduce_scatter, c::all_gather, c::broadcast, c::reduce})));
  EXPECT_TRUE((serves_exactly<algo::levels<>>(
      {c::all_reduce, c::reduce_scatter, c::all_gather, c::broadcast, c::reduce})));
}

TEST(capabilities, needs_are_declared_where_the_plans_have_them) {
  EXPECT_EQ(algo::capabilities_of<algo::direct>.loads, algo::peer_loads::always);
  EXPECT_EQ(algo::capabilities_of<algo::ring>.loads, algo::peer_loads::none);
  EXPECT_EQ((algo::capabilities_of<algo::hierarchical<algo::direct, algo::ring>>.loads),
            algo::peer_loads::by_layout);
  EXPECT_FALSE(algo::capabilities_of<algo::direct>.messages);
  EXPECT_TRUE(algo::capabilities_of<algo::ring>.messages);
  EXPECT_TRUE((algo::capabilities_of<algo::hierarchical<algo::ring, algo::ring>>.nodes));
  EXPECT_FALSE(algo::capabilities_of<algo::ring>.nodes);
}

// A user's algorithm tag in the form weft's tags once took: members, not `caps`.
struct loads_only_tag {
  static constexpr std::string_view name = "loads_only";
  static constexpr bool needs_peer_access = true;
  static constexpr bool needs_messages = false;
  static constexpr bool serves(collective x) { return x == c::all_reduce; }
  static plan make_plan(const plan_request& q) { return plan(q); }
};
struct plain_tag {
  static constexpr std::string_view name = "plain";
  static constexpr bool serves(collective x) { return x == c::all_reduce; }
  static plan make_plan(const plan_request& q) { return plan(q); }
};

TEST(capabilities, a_tag_without_caps_keeps_its_declared_needs) {
  constexpr auto loads_only = algo::capabilities_of<loads_only_tag>;
  EXPECT_EQ(loads_only.loads, algo::peer_loads::always);
  EXPECT_FALSE(loads_only.messages);
  EXPECT_TRUE(loads_only.serves.contains(c::all_reduce));
  EXPECT_FALSE(loads_only.serves.contains(c::broadcast));
  constexpr auto plain = algo::capabilities_of<plain_tag>;
  EXPECT_EQ(plain.loads, algo::peer_loads::none);
  EXPECT_TRUE(plain.messages);
}

// A communicator that sends but cannot load from its peers, as MPI's.
struct sends_only {
  static constexpr bool peer_access = false;
};

TEST(capabilities, runs_algorithm_answers_for_plan_making_tags_only) {
  static_assert(runs_algorithm<local::communicator, algo::ring>);
  static_assert(runs_algorithm<local::communicator, algo::direct>);
  static_assert(runs_algorithm<local::communicator, loads_only_tag>);
  static_assert(detail::lends_peer_access_for<sends_only, algo::ring>);
  static_assert(!detail::lends_peer_access_for<sends_only, algo::direct>);
  static_assert(!detail::lends_peer_access_for<sends_only, loads_only_tag>);
  // vendor calls the transport's own collectives and levels<> is two_level's: neither makes
  // plans, so no communicator "runs" them as plans.
  static_assert(!runs_algorithm<local::communicator, algo::vendor>);
  static_assert(!runs_algorithm<local::communicator, algo::levels<>>);
  SUCCEED();
}

} // namespace
