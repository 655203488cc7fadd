// The p2p transport's teardown order (weft/cuda/detail/p2p_teardown.hpp) on the host: the
// steps a rank takes, in order, and what it does when one cannot be taken or fails; then ranks
// as threads over weft::local's barrier, with a slow rank, where no rank may free a workspace
// that another still maps.
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/p2p_teardown.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace wd = weft::cuda::detail;

// Records the steps taken; `fails` names one that throws.
struct recorded_steps {
  bool ok = true;
  std::string fails;
  std::vector<std::string> taken;

  void step(const std::string& name) {
    taken.push_back(name);
    if (name == fails) throw weft::error("weft: " + name + " failed");
  }
  [[nodiscard]] bool healthy() const { return ok; }
  void sync_on_device() { step("sync"); }
  void close_imports() { step("close imports"); }
  void host_barrier() { step("barrier"); }
  void free_memory() { step("free"); }
  void leak_memory() noexcept { taken.emplace_back("leak"); }
};

using steps = std::vector<std::string>;

TEST(p2p_teardown, closes_imports_then_meets_the_peers_then_frees) {
  recorded_steps s;
  wd::p2p_tear_down(s);
  EXPECT_EQ(s.taken, (steps{"sync", "close imports", "barrier", "free"}));
}

TEST(p2p_teardown, a_failed_communicator_leaves_its_memory_allocated) {
  recorded_steps s;
  s.ok = false;
  wd::p2p_tear_down(s);
  EXPECT_EQ(s.taken, (steps{"leak"}));
}

// A step that throws stops the teardown (nothing escapes: it runs in destructors) and leaves
// the memory allocated: after a failed barrier a peer may still map it.
TEST(p2p_teardown, a_failed_step_leaves_the_memory_allocated_and_throws_nothing) {
  static_assert(noexcept(wd::p2p_tear_down(std::declval<recorded_steps&>())));
  const std::pair<std::string, steps> cases[] = {
      {"sync", {"sync", "leak"}},
      {"close imports", {"sync", "close imports", "leak"}},
      {"barrier", {"sync", "close imports", "barrier", "leak"}},
  };
  for (const auto& [fails, want] : cases) {
    recorded_steps s;
    s.fails = fails;
    wd::p2p_tear_down(s);
    EXPECT_EQ(s.taken, want) << fails;
  }
}

// Four ranks as threads, each exporting a workspace that the others map; the barrier is
// weft::local's. Rank 0 is slow to close its imports. Whenever a rank frees its workspace, no
// other rank may still map it (CUDA's rule for IPC memory); and every workspace is freed.
TEST(p2p_teardown, no_rank_frees_a_workspace_a_peer_still_maps) {
  constexpr int p = 4;
  // mapped[q][r]: rank r maps rank q's workspace.
  using mapping = std::vector<std::vector<std::atomic<bool>>>;
  mapping mapped(p);
  for (auto& row : mapped) {
    row = std::vector<std::atomic<bool>>(p);
    for (auto& m : row)
      m = true;
  }
  std::atomic<int> freed_while_mapped{0};
  std::atomic<int> freed{0};
  weft::local::run(p, [&](weft::local::communicator& host) {
    const int r = host.rank();
    struct rank_steps {
      weft::local::communicator& host;
      mapping& maps;
      std::atomic<int>& bad;
      std::atomic<int>& freed;
      int r;
      [[nodiscard]] bool healthy() const { return true; }
      void sync_on_device() {}
      void close_imports() {
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (int q = 0; q < p; ++q)
          maps[static_cast<std::size_t>(q)][static_cast<std::size_t>(r)] = false;
      }
      void host_barrier() { host.barrier(); }
      void free_memory() {
        for (int q = 0; q < p; ++q) {
          if (q != r && maps[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)]) ++bad;
        }
        ++freed;
      }
      void leak_memory() noexcept {}
    };
    wd::p2p_tear_down(rank_steps{host, mapped, freed_while_mapped, freed, r});
  });
  EXPECT_EQ(freed_while_mapped.load(), 0);
  EXPECT_EQ(freed.load(), p);
}

} // namespace
