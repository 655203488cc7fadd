// weft::traced over weft::local: collectives through it give the same results as without it
// (checked against plain sums), every one is recorded with its kind, per-rank count, type and
// axis, peer-access algorithms still run through it, split() keeps the axis, clear() empties.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace {

using weft::collective;
using weft::dtype;
using traced_local = weft::traced<weft::local::communicator>;

static_assert(weft::plan_executor<traced_local>);
static_assert(weft::peer_access<traced_local>);

TEST(Traced, RecordsEveryCollective) {
  const int p = 3;
  weft::local::run(p, [&](weft::local::communicator& c) {
    traced_local t(std::move(c), "tp");
    const int r = t.rank();
    std::vector<float> a(5);
    std::iota(a.begin(), a.end(), static_cast<float>(r));
    weft::all_reduce(t, std::span(a));
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(a[i], static_cast<float>(3 * i + 0 + 1 + 2));
    std::vector<double> in(2, r + 1.0), out(6);
    weft::all_gather(t, std::span<const double>(in), std::span(out));
    EXPECT_EQ(out, (std::vector<double>{1, 1, 2, 2, 3, 3}));
    std::vector<double> big(6, 1.0), mine(2);
    weft::reduce_scatter<weft::algo::ring>(t, std::span<const double>(big), std::span(mine));
    EXPECT_EQ(mine, (std::vector<double>{3, 3}));
    std::vector<float> d(4, static_cast<float>(r));
    weft::all_reduce<weft::algo::direct>(t, std::span(d));
    EXPECT_EQ(d[0], 3.0f);
    std::vector<std::int32_t> bc(7, r == 1 ? 9 : 0);
    weft::broadcast(t, std::span(bc), 1);
    EXPECT_EQ(bc[6], 9);
    const std::vector<weft::traced_op> want = {
        {collective::all_reduce, 5, dtype::float32, "tp"},
        {collective::all_gather, 2, dtype::float64, "tp"},
        {collective::reduce_scatter, 2, dtype::float64, "tp"},
        {collective::all_reduce, 4, dtype::float32, "tp"},
        {collective::broadcast, 7, dtype::int32, "tp"}};
    EXPECT_EQ(t.ops(), want);
    EXPECT_EQ(t.count(collective::all_reduce), 2u);
    t.clear();
    EXPECT_TRUE(t.ops().empty());

    traced_local sub = t.split(r % 2, r);
    EXPECT_EQ(sub.axis(), "tp");
    EXPECT_EQ(sub.size(), r % 2 == 0 ? 2 : 1);
    std::vector<float> s(3, 1.0f);
    weft::all_reduce(sub, std::span(s));
    EXPECT_EQ(s[0], static_cast<float>(sub.size()));
    ASSERT_EQ(sub.ops().size(), 1u);
    EXPECT_EQ(sub.ops()[0].axis, "tp");
    EXPECT_TRUE(t.ops().empty()); // the child records its own
  });
}

// The call check that the wrapped communicator asks for still runs through traced<>: ranks that
// ask for different reductions are told so, instead of one getting the other's.
TEST(Traced, KeepsTheWrappedCommunicatorsCallCheck) {
  weft::local::run(2, [&](weft::local::communicator& c) {
    c.set_check_calls(true);
    traced_local t(std::move(c), "dp");
    EXPECT_TRUE(t.check_calls());
    std::vector<std::int32_t> v{t.rank() == 0 ? 5 : 7};
    std::string what;
    try {
      if (t.rank() == 0) {
        weft::all_reduce<weft::algo::ring>(t, std::span(v), weft::op::sum{});
      } else {
        weft::all_reduce<weft::algo::ring>(t, std::span(v), weft::op::max{});
      }
    } catch (const weft::error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("different collectives"), std::string::npos)
        << "rank " << t.rank() << ": " << what;
  });
}

} // namespace
