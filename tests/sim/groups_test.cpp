// The simulator on the local transport's emulated topologies: every measured run of
// data/emulated_runs.csv (weft's own emulated-fabric benchmark) priced from the same plans on
// the same emulated cluster, within 25% of what was measured.
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/sim/groups.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "sim/csv_rows.hpp"

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, sep))
    out.push_back(x);
  return out;
}

// "0-3|4-7" or "0;2;4;6|1;3;5;7"
std::vector<std::vector<int>> parse_groups(const std::string& s) {
  std::vector<std::vector<int>> out;
  for (const auto& g : split(s, '|')) {
    std::vector<int> members;
    for (const auto& part : split(g, ';')) {
      const auto dash = part.find('-');
      if (dash == std::string::npos) {
        members.push_back(std::stoi(part));
      } else {
        for (int i = std::stoi(part.substr(0, dash)); i <= std::stoi(part.substr(dash + 1)); ++i)
          members.push_back(i);
      }
    }
    out.push_back(members);
  }
  return out;
}

TEST(sim_groups, emulated_runs_within_25_percent) {
  const std::string links = ",intra=shm:1GB/s:5us,inter=net:0.25GB/s:20us,reduce=1.64GB/s";
  int rows = 0;
  double worst = 0;
  for (const weft_test::csv_row& row :
       weft_test::read_csv_rows(weft_test::data_dir() + "/emulated_runs.csv")) {
    const auto cluster = weft::topology::parse(row.at("shape") + links);
    const std::string& a = row.at("algorithm");
    weft::plan (*make)(const weft::plan_request&) = nullptr;
    if (a == "ring")
      make = &weft::algo::ring::make_plan;
    else if (a == "tree")
      make = &weft::algo::tree::make_plan;
    else if (a == "hierarchical_ring_ring")
      make = &weft::algo::hierarchical<weft::algo::ring, weft::algo::ring>::make_plan;
    else if (a == "hierarchical_ring_tree")
      make = &weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>::make_plan;
    else
      ASSERT_EQ(a, "automatic") << row.where();
    const auto bytes = static_cast<std::size_t>(row.integer("bytes"));
    const double measured = row.number("measured_ms") * 1e-3;
    const double predicted =
        weft::sim::price_groups(weft::collective::all_reduce, parse_groups(row.at("groups")),
                                cluster, bytes / sizeof(float), sizeof(float), make);
    const double err = predicted / measured - 1;
    std::printf("  %-40s %9zu B: measured %7.1f ms, simulated %7.1f ms (%+5.1f%%)\n",
                row.at("case").c_str(), bytes, measured * 1e3, predicted * 1e3, 100 * err);
    EXPECT_LT(std::abs(err), 0.25) << row.where();
    worst = std::max(worst, std::abs(err));
    ++rows;
  }
  std::printf("  %d rows, worst %.1f%%\n", rows, 100 * worst);
  EXPECT_EQ(rows, 16);
}

TEST(sim_groups, groups_sharing_nics_take_longer_than_one_alone) {
  const auto c = weft::topology::parse("2x4,intra=shm:1GB/s:5us,inter=net:0.25GB/s:20us");
  const std::size_t count = 1 << 20;
  const double one = weft::sim::price_groups(weft::collective::all_reduce, {{0, 2, 4, 6}}, c, count,
                                             4, &weft::algo::ring::make_plan);
  const double two =
      weft::sim::price_groups(weft::collective::all_reduce, {{0, 2, 4, 6}, {1, 3, 5, 7}}, c, count,
                              4, &weft::algo::ring::make_plan);
  // One NIC per node carries both groups' crossings: close to twice the time.
  EXPECT_GT(two, 1.6 * one);
  EXPECT_LT(two, 2.2 * one);
  EXPECT_THROW(
      (void)weft::sim::price_groups(weft::collective::all_reduce, {{0, 1}, {1, 2}}, c, 8, 4),
      weft::error);
  EXPECT_THROW((void)weft::sim::price_groups(weft::collective::all_reduce, {{0, 9}}, c, 8, 4),
               weft::error);
}

} // namespace
