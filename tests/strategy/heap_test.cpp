// trainer->memory() beside an independent count: the process's heap, every operator new of this
// binary by malloc_usable_size. All ranks are threads of this process, so the heap's growth at
// its peak during a step is compared with the sum over the ranks of every category's growth to
// its peak in that step (an upper bound of what the account held at any one moment): a buffer
// the account does not see would show as heap growth beyond it. Not under a sanitizer, which
// brings its own operator new.
#include <weft/optim/optimizers.hpp>

#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "strategy_support.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WEFT_HEAP_TEST_COUNTS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WEFT_HEAP_TEST_COUNTS 0
#endif
#endif
#ifndef WEFT_HEAP_TEST_COUNTS
#define WEFT_HEAP_TEST_COUNTS 1
#endif

namespace {
std::atomic<std::int64_t> heap_now{0}, heap_peak{0};
void charge(void* p) {
  const auto n = static_cast<std::int64_t>(malloc_usable_size(p));
  const auto now = heap_now.fetch_add(n) + n;
  auto pk = heap_peak.load();
  while (now > pk && !heap_peak.compare_exchange_weak(pk, now)) {
  }
}
} // namespace

#if WEFT_HEAP_TEST_COUNTS
void* operator new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  charge(p);
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  heap_now.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)));
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
#endif

namespace {

namespace ts = weft::test::strategy;
namespace wl = weft::layer;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

std::size_t growth(const weft::memory_account& m) {
  std::size_t g = 0;
  for (const auto* a :
       {&m.weights, &m.gathered_weights, &m.gradients, &m.gradient_buckets, &m.optimizer_state,
        &m.master_weights, &m.activations, &m.scratch, &m.workspace}) {
    g += a->peak - a->current;
  }
  return g;
}

template <class S>
void compare(const std::string& what) {
  if (!WEFT_HEAP_TEST_COUNTS) GTEST_SKIP() << "a sanitizer's operator new";
  constexpr wl::gpt_config shape{
      .vocab = 512, .hidden = 64, .heads = 4, .ffn = 256, .seq = 32, .layers = 8};
  std::mutex mu;
  std::size_t account = 0;
  std::int64_t heap = 0;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(world, {.model = shape, .micro_batch = 2, .global_batch = 16}, ts::adamw_rule);
    const auto b0 = ts::batch_of(0, 16, {.vocab = shape.vocab, .seq = shape.seq});
    (void)t->train_step(b0.ids, b0.targets); // the workspace is allocated in the first step
    const auto b = ts::batch_of(1, 16, {.vocab = shape.vocab, .seq = shape.seq});
    std::int32_t x[1] = {0};
    weft::all_reduce(world, std::span<std::int32_t>(x));
    if (world.rank() == 0) heap_peak.store(heap_now.load());
    const std::int64_t start = heap_now.load();
    weft::all_reduce(world, std::span<std::int32_t>(x));
    (void)t->train_step(b.ids, b.targets);
    weft::all_reduce(world, std::span<std::int32_t>(x));
    std::lock_guard lock(mu);
    account += growth(t->memory()); // after the step every category is back to its start
    if (world.rank() == 0) heap = heap_peak.load() - start;
  });
  std::printf("%s: heap grew by %lld bytes at its peak; the account's categories by at most %zu\n",
              what.c_str(), static_cast<long long>(heap), account);
  EXPECT_LE(static_cast<double>(heap), 1.1 * static_cast<double>(account)) << what;
}

TEST(heap, zero3_dp4_1f1b_grows_no_more_than_the_account) {
  compare<weft::strategy<mesh<tp<1>, pp<1>, dp<4>>, pipeline::one_f_one_b, optim::zero<3>,
                         wl::recompute::none>>("1x1x4 zero<3> 1F1B");
}
TEST(heap, zero1_pp2_gpipe_grows_no_more_than_the_account) {
  compare<weft::strategy<mesh<tp<1>, pp<2>, dp<2>>, pipeline::gpipe, optim::zero<1>,
                         wl::recompute::none>>("1x2x2 zero<1> GPipe");
}

} // namespace
