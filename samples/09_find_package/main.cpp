// A program that uses weft from outside its tree, through find_package(weft) and the
// weft::weft target (see README.md): a gradient averaged over 4 ranks, threads of this
// process (weft::local), with the ring all-reduce, each rank checking what it got.
//
//   build/weft_find_package_sample
#include <weft/weft.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <span>
#include <vector>

int main() try {
  constexpr int ranks = 4;
  constexpr std::size_t n = 1 << 20;
  std::vector<int> wrong(ranks, 0);
  weft::local::run(ranks, [&](weft::local::communicator& comm) {
    const int r = comm.rank();
    // Rank r's gradient: element i is r + i % 7, so the sum over the ranks is 6 + 4 (i % 7).
    std::vector<float> grad(n);
    for (std::size_t i = 0; i < n; ++i)
      grad[i] = static_cast<float>(r) + static_cast<float>(i % 7);
    weft::all_reduce<weft::algo::ring>(comm, std::span<float>(grad));
    for (std::size_t i = 0; i < n; ++i) {
      const float mean = grad[i] / ranks;
      if (mean != (6.0f + 4.0f * static_cast<float>(i % 7)) / ranks)
        ++wrong[static_cast<std::size_t>(r)];
    }
  });
  int bad = 0;
  for (int r = 0; r < ranks; ++r) {
    std::printf("rank %d: %zu floats averaged with weft::algo::ring, %d wrong\n", r, n,
                wrong[static_cast<std::size_t>(r)]);
    bad += wrong[static_cast<std::size_t>(r)];
  }
  return bad == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_find_package_sample: %s\n", e.what());
  return 1;
}
