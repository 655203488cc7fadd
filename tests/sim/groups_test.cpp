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
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string data_dir() {
  std::string here = __FILE__;
  return here.substr(0, here.rfind("/tests/sim/")) + "/data";
}

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
  const std::string path = data_dir() + "/emulated_runs.csv";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string links = ",intra=shm:1GB/s:5us,inter=net:0.25GB/s:20us,reduce=1.64GB/s";
  std::string line;
  bool header = true;
  int rows = 0;
  double worst = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    const auto cells = split(line, ',');
    ASSERT_EQ(cells.size(), 7u) << line;
    const auto cluster = weft::topology::parse(cells[2] + links);
    const std::string& a = cells[3];
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
      ASSERT_EQ(a, "automatic") << line;
    const std::size_t bytes = std::stoull(cells[5]);
    const double measured = std::stod(cells[6]) * 1e-3;
    const double predicted =
        weft::sim::price_groups(weft::collective::all_reduce, parse_groups(cells[4]), cluster,
                                bytes / sizeof(float), sizeof(float), make);
    const double err = predicted / measured - 1;
    std::printf("  %-40s %9zu B: measured %7.1f ms, simulated %7.1f ms (%+5.1f%%)\n",
                cells[1].c_str(), bytes, measured * 1e3, predicted * 1e3, 100 * err);
    EXPECT_LT(std::abs(err), 0.25) << line;
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
