// automatic beside a vendor collective: the vendor is taken exactly where its modelled price
// is not above every plan's, over sizes, world sizes and node layouts; a communicator that
// prices its own collective gets it run by the default path.
#include <weft/comm/plan/nccl_model.hpp>
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "support/scale.hpp"

namespace {

using namespace weft;
namespace topo = weft::topology;

topo::cluster nodes_of_8(int nodes) {
  return topo::cluster(std::vector<int>(static_cast<std::size_t>(nodes), 8),
                       topo::default_link(topo::link_kind::nvlink),
                       topo::default_link(topo::link_kind::infiniband), 8);
}

// ranks: per_node on each of `nodes` nodes, placed node-major on a cluster of 8 per node.
struct placement {
  plan_request q;
  std::vector<int> devices;
};
placement place(collective c, int nodes, int per_node, std::size_t bytes) {
  placement p;
  p.q.coll = c;
  p.q.size = nodes * per_node;
  p.q.element_size = 4;
  p.q.count = std::max<std::size_t>(bytes / 4, 1);
  for (int n = 0; n < nodes; ++n) {
    for (int j = 0; j < per_node; ++j) {
      p.q.node_of.push_back(n);
      p.devices.push_back(8 * n + j);
    }
  }
  return p;
}

// The cheapest plan's price, recomputed here over the candidates an NCCL communicator runs
// (no peer loads; hierarchical only across nodes), each plan round costing `round` more.
double cheapest_plan(const placement& p, const topo::cluster& c, double round = 0) {
  const std::set<int> nodes(p.q.node_of.begin(), p.q.node_of.end());
  double best = std::numeric_limits<double>::infinity();
  for (const auto& a : algo::candidates()) {
    if (!a.serves(p.q.coll) || a.needs_peer_access || (a.needs_nodes && nodes.size() < 2)) continue;
    const auto plans = cost_model::plans_of(a.make_plan, p.q);
    std::uint32_t rounds = 0;
    for (const auto& pl : plans)
      for (const auto& x : pl.steps())
        rounds = std::max(rounds, x.round + 1);
    best =
        std::min(best, cost_model::price(plans, c, p.devices, p.q.element_size) + round * rounds);
  }
  return best;
}

// Over sizes and layouts, with plans priced on the links alone and with the NCCL
// communicator's cost per round (an NCCL kernel launch per round).
TEST(automatic_choice, vendor_exactly_where_nccl_is_priced_no_higher_than_every_plan) {
  struct layout {
    int nodes, per_node;
  };
  std::vector<layout> layouts = {{1, 2}, {1, 3}, {1, 4}, {1, 8}, {2, 8}, {4, 8}, {8, 8}};
  // 512 ranks' plans take long to price, on one thread: a sanitizer's build (130 s under ASan
  // at -O0 with them) stops at 64 ranks.
  if (!weft::test::sanitized) layouts.push_back({64, 8});
  int vendor = 0, planned = 0, planned_on_nccl = 0;
  for (const double round : {0.0, cost_model::nccl_plan_round_seconds})
    for (const auto [nodes, per_node] : layouts) {
      const auto c = nodes_of_8(nodes);
      // 4 B .. 1 GiB by factors of 16 (of 64 on 512 ranks, whose plans are long to price; of
      // 256 under a sanitizer).
      const std::size_t step = weft::test::sanitized ? 256 : nodes * per_node > 64 ? 64 : 16;
      for (std::size_t bytes = 4; bytes <= (std::size_t{1} << 30); bytes *= step) {
        const placement p = place(collective::all_reduce, nodes, per_node, bytes);
        const double nccl = cost_model::nccl_price(p.q, c).seconds;
        const algo::choice got = algo::choose_path(p.q, c, p.devices, false, true, nccl, round);
        const double plan = cheapest_plan(p, c, round);
        const std::string where = std::to_string(nodes) + "x" + std::to_string(per_node) + " " +
                                  std::to_string(bytes) + " B: nccl " + std::to_string(nccl) +
                                  " s, best plan " + std::to_string(plan) + " s";
        EXPECT_EQ(got.vendor, nccl <= plan) << where;
        ASSERT_NE(got.plan, nullptr) << where;
        EXPECT_DOUBLE_EQ(got.plan_seconds, plan) << where;
        EXPECT_EQ(got.name(), got.vendor ? "vendor" : got.plan->name) << where;
        (got.vendor ? vendor : planned) += 1;
        if (!got.vendor && round > 0) ++planned_on_nccl;
      }
    }
  // Both outcomes occur: the rule is not a constant. With a kernel launch per round, NCCL's
  // own collective is priced lower than every plan at every point.
  EXPECT_GT(vendor, 0);
  EXPECT_GT(planned, 0);
  EXPECT_EQ(planned_on_nccl, 0);
}

TEST(automatic_choice, the_vendor_price_alone_decides_against_a_fixed_plan) {
  const auto c = nodes_of_8(1);
  const placement p = place(collective::all_reduce, 1, 8, 1 << 20);
  const double plan = cheapest_plan(p, c);
  EXPECT_TRUE(algo::choose_path(p.q, c, p.devices, false, true, plan).vendor); // a tie: vendor
  EXPECT_TRUE(algo::choose_path(p.q, c, p.devices, false, true, plan * 0.99).vendor);
  EXPECT_FALSE(algo::choose_path(p.q, c, p.devices, false, true, plan * 1.01).vendor);
  EXPECT_FALSE(algo::choose_path(p.q, c, p.devices, false, true, std::nullopt).vendor);
  EXPECT_THROW((void)algo::choose_path(p.q, c, p.devices, false, true, -1.0), error);
  EXPECT_THROW((void)algo::choose_path(p.q, c, p.devices, false, true,
                                       std::numeric_limits<double>::quiet_NaN()),
               error);
}

// A local communicator with a "vendor" collective of its own (weft's ring, counted), priced
// at `price` seconds for sum and not at all for other operators.
class priced_local : public local::communicator {
public:
  explicit priced_local(local::communicator c, double price, int* calls)
      : local::communicator(std::move(c)), price_(price), calls_(calls) {}
  priced_local split(int color, int key) {
    return priced_local(local::communicator::split(color, key), price_, calls_);
  }
  template <collective C, class T, class Op>
  std::optional<double> vendor_price(const plan_request&) const {
    if constexpr (std::is_same_v<Op, op::sum>) {
      return price_;
    } else {
      return std::nullopt;
    }
  }
  template <collective C, class T, class Op>
  void vendor(const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
              const Op& op) {
    ++calls_[rank()];
    local::communicator& base = *this;
    detail::run_planned<C, algo::ring>(base, in, in_n, out, out_n, count, root, op);
  }

private:
  double price_;
  int* calls_;
};

TEST(automatic_choice, the_default_path_runs_the_vendor_where_it_is_chosen) {
  for (const double price : {0.0, 1e9}) {
    int calls[3] = {0, 0, 0};
    local::run(3, [&](local::communicator& base) {
      priced_local c(std::move(base), price, calls);
      std::vector<int> v(5, c.rank() + 1);
      const algo::choice chosen = automatic_choice<collective::all_reduce, int>(c, v.size());
      EXPECT_EQ(chosen.vendor, price == 0.0);
      all_reduce(c, std::span(v));
      for (int x : v)
        EXPECT_EQ(x, 6);
      // max has no vendor price: weft's plan, whatever the price of sum.
      all_reduce(c, std::span(v), op::max{});
      EXPECT_FALSE((automatic_choice<collective::all_reduce, int, op::max>(c, v.size()).vendor));
    });
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(calls[r], price == 0.0 ? 1 : 0) << "rank " << r << " price " << price;
  }
}

TEST(automatic_choice, a_communicator_without_a_vendor_gets_plans) {
  local::run(2, [](local::communicator& c) {
    const algo::choice got = automatic_choice<collective::all_reduce, float>(c, 1024);
    EXPECT_FALSE(got.vendor);
    EXPECT_FALSE(got.vendor_seconds.has_value());
    ASSERT_NE(got.plan, nullptr);
    EXPECT_EQ(got.name(), got.plan->name);
  });
}

} // namespace
