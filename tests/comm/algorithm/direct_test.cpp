#include <weft/comm/algorithm/direct.hpp>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;

TEST(direct, every_collective_every_size) {
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                       collective::broadcast, collective::reduce, collective::all_to_all}) {
    for (int p : {1, 2, 3, 4, 5, 8, 9, 16}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p - 1), std::size_t(p + 3),
                            std::size_t{5000}}) {
        check_plans<weft::algo::direct, int>(c, p, n, p - 1);
        check_plans<weft::algo::direct, float, weft::op::max>(c, p, n, 0);
        check_plans<weft::algo::direct, double>(c, p, n, p / 2, pattern::random);
      }
    }
  }
}

} // namespace
