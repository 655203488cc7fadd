// The bookkeeping of device scratch that grows (weft/cuda/detail/scratch_ledger.hpp) on the
// host: a block that a captured call used outlives its replacement until it is released, and
// every block is freed exactly once. Checked by a fake heap and fake graphs that remember the
// blocks their captured calls were given.
#include <weft/cuda/detail/scratch_ledger.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using ledger = weft::cuda::detail::scratch_ledger;
using block = ledger::block;

// What an owner does with a ledger (stream_memory's reserve, release_retired, its end), on a fake
// heap: the addresses of the blocks allocated and not yet freed.
struct fake_owner {
  ledger l;
  std::set<void*> live;
  std::map<void*, int> frees;
  std::uintptr_t next = 0x1000;

  void free(const block& b) {
    if (b.p == nullptr) return;
    ++frees[b.p];
    live.erase(b.p);
  }
  // A call needing `bytes`: the block it is given (nullptr for none), or a refusal while
  // capturing (the owner throws then).
  void* call(std::size_t bytes, bool capturing, bool* refused = nullptr) {
    if (l.fits(bytes, capturing)) return l.current().p;
    if (capturing) {
      if (refused != nullptr) *refused = true;
      return nullptr;
    }
    void* p = reinterpret_cast<void*>(next);
    next += 0x1000;
    live.insert(p);
    free(l.replace({p, bytes}));
    return p;
  }
  void release_retired() {
    for (const block& b : l.take_retired())
      free(b);
  }
  void end() {
    release_retired();
    free(l.take_current());
  }
};

TEST(scratch_ledger, a_block_no_capture_used_is_freed_when_it_grows) {
  fake_owner o;
  void* a = o.call(100, false);
  void* b = o.call(200, false);
  EXPECT_NE(a, b);
  EXPECT_EQ(o.live, std::set<void*>{b});
  EXPECT_EQ(o.frees[a], 1);
  EXPECT_TRUE(o.l.retired().empty());
}

// The fault this guards against: a graph captured a call on block a; a later, larger call
// outside the capture grows the scratch. Block a must stay allocated for the graph's replays.
TEST(scratch_ledger, a_block_a_graph_captured_outlives_its_replacement) {
  fake_owner o;
  void* a = o.call(100, false);
  void* captured = o.call(80, true); // captured into a graph: the graph points into a
  EXPECT_EQ(captured, a);
  EXPECT_TRUE(o.l.current_captured());
  void* b = o.call(4096, false); // grows outside the capture
  EXPECT_NE(b, a);
  EXPECT_EQ(o.live.count(a), 1u) << "the captured block was freed while its graph may replay";
  EXPECT_EQ(o.l.retired(), (std::vector<block>{{a, 100}}));
  EXPECT_EQ(o.l.retired_bytes(), 100u);
  EXPECT_FALSE(o.l.current_captured()); // b was not captured
  void* c = o.call(8192, false);
  EXPECT_EQ(o.frees[b], 1); // b no graph used: freed at once
  EXPECT_EQ(o.l.retired().size(), 1u);
  o.release_retired(); // the graphs are gone
  EXPECT_EQ(o.frees[a], 1);
  EXPECT_EQ(o.live, std::set<void*>{c});
  o.end();
  EXPECT_TRUE(o.live.empty());
}

TEST(scratch_ledger, a_captured_call_larger_than_the_block_is_refused) {
  fake_owner o;
  (void)o.call(100, false);
  bool refused = false;
  EXPECT_EQ(o.call(101, true, &refused), nullptr);
  EXPECT_TRUE(refused);
  EXPECT_FALSE(o.l.current_captured());
  // A captured call that needs no scratch fits, and marks no block: nothing to keep for it.
  fake_owner empty;
  EXPECT_EQ(empty.call(0, true), nullptr);
  EXPECT_FALSE(empty.l.current_captured());
  (void)o.call(0, true);
  EXPECT_FALSE(o.l.current_captured());
  (void)o.call(1, true);
  EXPECT_TRUE(o.l.current_captured());
}

// Random calls in and out of captures, graphs kept and dropped: at every step every block a
// live graph holds is allocated; at the end every block is freed exactly once.
TEST(scratch_ledger, random_captures_never_see_freed_memory_and_nothing_leaks) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    fake_owner o;
    std::vector<std::set<void*>> graphs; // the blocks each live graph's calls were given
    bool in_capture = false;
    for (int i = 0; i < 60; ++i) {
      const auto what = rng() % 10;
      if (what < 2) { // start or end a capture: a new graph
        in_capture = !in_capture;
        if (in_capture) graphs.emplace_back();
      } else if (what == 2 && !graphs.empty() && !in_capture) { // destroy every graph, release
        graphs.clear();
        o.release_retired();
      } else {
        const std::size_t bytes = rng() % 5000;
        bool refused = false;
        void* p = o.call(bytes, in_capture, &refused);
        if (in_capture && !refused && p != nullptr) graphs.back().insert(p);
      }
      for (const auto& g : graphs) {
        for (void* p : g)
          ASSERT_EQ(o.live.count(p), 1u) << "round " << round << ", step " << i;
      }
    }
    o.end();
    EXPECT_TRUE(o.live.empty()) << "round " << round;
    for (const auto& [p, n] : o.frees)
      EXPECT_EQ(n, 1) << "round " << round;
  }
}

} // namespace
