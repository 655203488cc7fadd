// The p2p transport's fused all-reduce kernels (weft/cuda/detail/p2p_fused.hpp) on the host:
// which plans take them, how their blocks and threads cut the elements (a whole call of p ranks
// run phase by phase on host memory, against a serial reference), and their barriers' epochs
// (ranks as threads running the barrier's rules on plain atomics, fused calls of several blocks
// mixed with step-by-step syncs, then a rank that never arrives and one that gives up).
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/core/half.hpp>
#include <weft/cuda/detail/p2p_epoch.hpp>
#include <weft/cuda/detail/p2p_fused.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

namespace wd = weft::cuda::detail;
using wd::p2p_fused_shape;
using weft::buffer;
using weft::collective;
using weft::plan;
using weft::plan_request;

plan direct_plan(collective c, int p, int r, std::size_t n, std::size_t element_size = 4) {
  return weft::algo::direct::make_plan(plan_request{c, p, r, n, 0, {}, element_size});
}

// --- which calls take a fused kernel ------------------------------------------------------------

TEST(p2p_fused, direct_all_reduces_on_one_to_eight_ranks_are_fused) {
  const std::size_t counts[] = {1, 2, 3, 7, 8, 9, 100, 4095, 4096, 4097, 5000, 100003};
  for (int p = 1; p <= 10; ++p) {
    for (std::size_t n : counts) {
      for (std::size_t es : {std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        for (int r = 0; r < p; ++r) {
          const plan pl = direct_plan(collective::all_reduce, p, r, n, es);
          // The reference: one-shot up to 16 KiB of data, two-shot beyond, on 2..8 ranks; one
          // rank's copy.
          p2p_fused_shape want = p == 1 ? p2p_fused_shape::one_rank : p2p_fused_shape::none;
          if (p >= 2 && p <= 8)
            want = n * es <= 16 * 1024 ? p2p_fused_shape::one_shot : p2p_fused_shape::two_shot;
          EXPECT_EQ(wd::p2p_fused_shape_of(pl, p), want)
              << "p " << p << " rank " << r << " n " << n << " element " << es << "\n"
              << pl.to_string();
        }
      }
    }
  }
}

TEST(p2p_fused, other_collectives_algorithms_and_altered_plans_run_step_by_step) {
  for (collective c : {collective::reduce_scatter, collective::all_gather, collective::broadcast,
                       collective::reduce, collective::all_to_all}) {
    EXPECT_EQ(wd::p2p_fused_shape_of(direct_plan(c, 4, 1, 100), 4), p2p_fused_shape::none);
    EXPECT_EQ(wd::p2p_fused_shape_of(direct_plan(c, 4, 1, 100000), 4), p2p_fused_shape::none);
  }
  const plan rd = weft::algo::recursive_doubling::make_plan(
      plan_request{collective::all_reduce, 4, 1, 100, 0, {}, 4});
  EXPECT_EQ(wd::p2p_fused_shape_of(rd, 4), p2p_fused_shape::none);
  // Zero elements; a communicator size other than the plan's.
  EXPECT_EQ(wd::p2p_fused_shape_of(direct_plan(collective::all_reduce, 4, 1, 0), 4),
            p2p_fused_shape::none);
  EXPECT_EQ(wd::p2p_fused_shape_of(direct_plan(collective::all_reduce, 4, 1, 100), 5),
            p2p_fused_shape::none);

  // Hand-built plans one step away from direct's: none of them is fused.
  const auto one_shot = [](std::size_t copy_n, std::size_t reduce_n, bool reversed_group) {
    plan pl(plan_request{collective::all_reduce, 3, 0, 10, 0, {}, 4});
    const int g =
        pl.add_group(reversed_group ? std::vector<int>{2, 1, 0} : std::vector<int>{0, 1, 2});
    pl.stage();
    pl.need_scratch(10);
    pl.copy(buffer::input, 0, buffer::scratch, 0, copy_n);
    pl.sync(g);
    pl.load_reduce(g, buffer::scratch, 0, buffer::output, 0, reduce_n);
    return pl;
  };
  EXPECT_EQ(wd::p2p_fused_shape_of(one_shot(10, 10, false), 3), p2p_fused_shape::one_shot);
  EXPECT_EQ(wd::p2p_fused_shape_of(one_shot(9, 10, false), 3), p2p_fused_shape::none);
  EXPECT_EQ(wd::p2p_fused_shape_of(one_shot(10, 9, false), 3), p2p_fused_shape::none);
  EXPECT_EQ(wd::p2p_fused_shape_of(one_shot(10, 10, true), 3), p2p_fused_shape::none);

  const auto two_shot = [](int skip_load, bool last_sync, std::size_t reduce_begin) {
    const std::size_t n = 100000;
    plan pl(plan_request{collective::all_reduce, 3, 1, n, 0, {}, 4});
    const int g = pl.add_group({0, 1, 2});
    pl.sync(g);
    const auto mine = weft::detail::split_block(n, 3, 1);
    pl.load_reduce(g, buffer::input, reduce_begin, buffer::output, reduce_begin, mine.count);
    pl.sync(g);
    for (int s : {2, 0}) {
      if (s == skip_load) continue;
      const auto b = weft::detail::split_block(n, 3, static_cast<std::size_t>(s));
      pl.load(s, buffer::output, b.begin, buffer::output, b.begin, b.count);
    }
    if (last_sync) pl.sync(g);
    return pl;
  };
  const std::size_t begin1 = weft::detail::split_block(100000, 3, 1).begin;
  EXPECT_EQ(wd::p2p_fused_shape_of(two_shot(-1, true, begin1), 3), p2p_fused_shape::two_shot);
  EXPECT_EQ(wd::p2p_fused_shape_of(two_shot(0, true, begin1), 3), p2p_fused_shape::none);
  EXPECT_EQ(wd::p2p_fused_shape_of(two_shot(-1, false, begin1), 3), p2p_fused_shape::none);
  EXPECT_EQ(wd::p2p_fused_shape_of(two_shot(-1, true, begin1 + 1), 3), p2p_fused_shape::none);
}

TEST(p2p_fused, a_call_makes_the_syncs_of_its_step_by_step_plan) {
  // The reference: the sync steps of direct's plan (plus the captured staged call's last sync).
  for (int p = 2; p <= 8; ++p) {
    for (std::size_t n : {std::size_t{10}, std::size_t{100000}}) {
      const plan pl = direct_plan(collective::all_reduce, p, 1, n);
      int syncs = 0;
      for (const auto& s : pl.steps())
        syncs += s.kind == weft::step_kind::sync ? 1 : 0;
      const p2p_fused_shape shape = wd::p2p_fused_shape_of(pl, p);
      EXPECT_EQ(wd::p2p_fused_barriers(shape, false), syncs);
      EXPECT_EQ(wd::p2p_fused_barriers(shape, true), syncs + (pl.staged() ? 1 : 0));
    }
  }
}

// --- the index math: a whole call on host memory ------------------------------------------------

// Every element of each phase's range handled exactly once over the grid's blocks and threads.
struct coverage {
  static constexpr int width = 4; // 16 bytes of float
  std::vector<int>* hits;
  void operator()(std::size_t i) const { ++(*hits)[i]; }
  void pack(std::size_t e) const {
    for (int l = 0; l < width; ++l)
      ++(*hits)[e + static_cast<std::size_t>(l)];
  }
};

template <class F>
void run_grid(const F& f, std::size_t indices, unsigned blocks, unsigned threads) {
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t)
      wd::p2p_fused_indices(indices, b, blocks, t, threads, f);
}

TEST(p2p_fused, the_grid_covers_every_element_of_every_phase_once) {
  for (std::size_t n :
       {std::size_t{1}, std::size_t{5}, std::size_t{37}, std::size_t{1000}, std::size_t{4099}}) {
    for (std::uintptr_t misalign : {std::uintptr_t{0}, std::uintptr_t{4}, std::uintptr_t{12}}) {
      for (unsigned blocks : {1u, 3u, 7u}) {
        const int p = 3;
        const std::uintptr_t in = 0x10000 + misalign;
        const std::uintptr_t out = 0x90000 + misalign;
        const std::uintptr_t stage[3] = {0x200000, 0x300000, 0x400000};
        const std::uintptr_t reduced[3] = {0x500000, 0x600000, 0x700000};
        for (auto shape : {p2p_fused_shape::one_shot, p2p_fused_shape::two_shot}) {
          for (int r = 0; r < p; ++r) {
            const wd::p2p_fused_work w =
                wd::p2p_fused_ranges(shape, p, r, n, 4, in, out, stage, reduced);
            std::vector<int> hits(n, 0);
            const auto cover = [&](const wd::p2p_fused_range& range) {
              std::vector<int> local(range.count, 0);
              run_grid(weft::detail::split_by_packs<coverage>{{&local}, range.cut},
                       range.cut.indices(), blocks, 5);
              for (std::size_t i = 0; i < range.count; ++i)
                hits[range.offset + i] += local[i];
            };
            cover(w.copy);
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(hits[i], 1) << "copy, element " << i;
            hits.assign(n, 0);
            cover(w.reduce);
            // The reference: one-shot reduces everything, two-shot the rank's block.
            const auto mine = shape == p2p_fused_shape::one_shot
                                  ? weft::detail::block_range{0, n}
                                  : weft::detail::split_block(n, static_cast<std::size_t>(p),
                                                              static_cast<std::size_t>(r));
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(hits[i], i >= mine.begin && i < mine.begin + mine.count ? 1 : 0)
                  << "reduce, element " << i;
            if (shape == p2p_fused_shape::two_shot) {
              ASSERT_EQ(w.gathers, p);
              hits.assign(n, 0);
              for (int k = 0; k < w.gathers; ++k)
                cover(w.gather[k]);
              for (std::size_t i = 0; i < n; ++i)
                ASSERT_EQ(hits[i], 1) << "gather, element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(p2p_fused, packs_start_where_every_operand_is_16_byte_aligned) {
  // in at 4 mod 16, the staging areas aligned: the copy shares no boundary; out at 4 mod 16
  // with aligned stages: none for the reduction either. in and out at 8 mod 16 with the stages at
  // 8 mod 16: a head of two floats, then packs.
  const std::uintptr_t stage[2] = {0x1008, 0x2008};
  const std::uintptr_t reduced[2] = {0x3000, 0x4000};
  const wd::p2p_fused_work w =
      wd::p2p_fused_ranges(p2p_fused_shape::one_shot, 2, 0, 23, 4, 0x5008, 0x6008, stage, reduced);
  EXPECT_EQ(w.copy.cut, (weft::detail::pack_split{2, 5, 1}));
  EXPECT_EQ(w.reduce.cut, (weft::detail::pack_split{2, 5, 1}));
  const std::uintptr_t aligned[2] = {0x1000, 0x2000};
  const wd::p2p_fused_work v = wd::p2p_fused_ranges(p2p_fused_shape::one_shot, 2, 0, 23, 4, 0x5004,
                                                    0x6004, aligned, reduced);
  EXPECT_EQ(v.copy.cut, (weft::detail::pack_split{0, 0, 23}));
  EXPECT_EQ(v.reduce.cut, (weft::detail::pack_split{0, 0, 23}));
}

// A whole fused call of p ranks on host memory, phase by phase as the kernel's barriers order
// them, with every block and thread of the grid: the functors and ranges the kernel gets.
template <class T, class Op>
std::vector<std::vector<T>> fused_call(p2p_fused_shape shape, const std::vector<std::vector<T>>& in,
                                       wd::p2p_average average, unsigned blocks) {
  const int p = static_cast<int>(in.size());
  const std::size_t n = in[0].size();
  // Buffers one element past a 16-byte boundary where the ranks' addresses allow it, to cut heads.
  std::vector<std::vector<T>> input(in), out(static_cast<std::size_t>(p), std::vector<T>(n + 1));
  std::vector<std::unique_ptr<T[]>> stage, reduced;
  std::uintptr_t stage_at[8] = {}, reduced_at[8] = {};
  for (int q = 0; q < p; ++q) {
    stage.emplace_back(new T[n + 32]);
    reduced.emplace_back(new T[n + 32]);
    stage_at[q] = reinterpret_cast<std::uintptr_t>(stage.back().get());
    reduced_at[q] = reinterpret_cast<std::uintptr_t>(reduced.back().get());
  }
  std::vector<wd::p2p_fused_work> work;
  for (int r = 0; r < p; ++r) {
    auto& o = out[static_cast<std::size_t>(r)];
    work.push_back(wd::p2p_fused_ranges(
        shape, p, r, n, sizeof(T),
        reinterpret_cast<std::uintptr_t>(input[static_cast<std::size_t>(r)].data()),
        reinterpret_cast<std::uintptr_t>(o.data() + 1), stage_at, reduced_at));
  }
  const auto at = [](std::uintptr_t a, std::size_t off) { return reinterpret_cast<T*>(a) + off; };
  const bool alone = shape == p2p_fused_shape::one_rank;
  for (int r = 0; r < p; ++r) { // the copy, then the barrier
    const auto& w = work[static_cast<std::size_t>(r)];
    wd::p2p_stage_elements<T> f{
        alone ? out[0].data() + 1 : at(stage_at[r], 0), input[static_cast<std::size_t>(r)].data(),
        average == wd::p2p_average::prescale, weft::detail::average_scale<T>(p),
        alone && average == wd::p2p_average::divide ? p : 0};
    run_grid(weft::detail::split_by_packs<wd::p2p_stage_elements<T>>{f, w.copy.cut},
             w.copy.cut.indices(), blocks, 7);
  }
  for (int r = 0; r < p && !alone; ++r) { // the reduction
    const auto& w = work[static_cast<std::size_t>(r)];
    T* const o = out[static_cast<std::size_t>(r)].data() + 1;
    weft::detail::reduce_sources<T, Op> sum{
        shape == p2p_fused_shape::one_shot ? o : at(reduced_at[r], w.reduce.offset), {}, p, Op{}};
    for (int q = 0; q < p; ++q)
      sum.src[q] = at(stage_at[q], w.reduce.offset);
    wd::p2p_reduce_elements<T, Op> f{sum, average == wd::p2p_average::divide ? p : 0};
    run_grid(weft::detail::split_by_packs<wd::p2p_reduce_elements<T, Op>>{f, w.reduce.cut},
             w.reduce.cut.indices(), blocks, 7);
  }
  if (shape == p2p_fused_shape::two_shot) { // barrier, the gathers
    for (int r = 0; r < p; ++r) {
      const auto& w = work[static_cast<std::size_t>(r)];
      T* const o = out[static_cast<std::size_t>(r)].data() + 1;
      for (int k = 0; k < w.gathers; ++k) {
        const int s = (r + k) % p;
        weft::detail::copy_elements<T> f{o + w.gather[k].offset,
                                         at(reduced_at[s], w.gather[k].offset)};
        run_grid(weft::detail::split_by_packs<weft::detail::copy_elements<T>>{f, w.gather[k].cut},
                 w.gather[k].cut.indices(), blocks, 7);
      }
    }
  }
  for (auto& o : out)
    o.erase(o.begin());
  return out;
}

TEST(p2p_fused, a_fused_call_gives_every_rank_the_group_order_sum) {
  for (int p = 2; p <= 8; ++p) {
    for (std::size_t n : {std::size_t{1}, std::size_t{6}, std::size_t{17}, std::size_t{1001}}) {
      std::vector<std::vector<float>> in(static_cast<std::size_t>(p), std::vector<float>(n));
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < n; ++i) // values whose sum depends on the order
          in[static_cast<std::size_t>(q)][i] =
              (q % 2 == 0 ? 1e8f : 1.0f) * static_cast<float>(q + 1) +
              0.37f * static_cast<float>(i % 13);
      // The reference: left to right over the ranks in float.
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) {
        float acc = in[0][i];
        for (int q = 1; q < p; ++q)
          acc += in[static_cast<std::size_t>(q)][i];
        want[i] = acc;
      }
      for (auto shape : {p2p_fused_shape::one_shot, p2p_fused_shape::two_shot}) {
        for (unsigned blocks : {1u, 4u}) {
          const auto got =
              fused_call<float, weft::op::sum>(shape, in, wd::p2p_average::none, blocks);
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(std::memcmp(&got[static_cast<std::size_t>(r)][i], &want[i], sizeof(float)),
                        0)
                  << "p " << p << " n " << n << " rank " << r << " element " << i << ": "
                  << got[static_cast<std::size_t>(r)][i] << " vs " << want[i];
        }
      }
    }
  }
}

TEST(p2p_fused, avg_divides_the_sum_or_prescales_half_as_the_step_by_step_path) {
  const int p = 8;
  const std::size_t n = 45;
  {
    std::vector<std::vector<float>> in(p, std::vector<float>(n));
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < n; ++i)
        in[static_cast<std::size_t>(q)][i] = 0.1f * static_cast<float>(q) + static_cast<float>(i);
    for (auto shape : {p2p_fused_shape::one_shot, p2p_fused_shape::two_shot}) {
      const auto got = fused_call<float, weft::op::avg>(shape, in, wd::p2p_average::divide, 3);
      for (std::size_t i = 0; i < n; ++i) {
        float acc = in[0][i];
        for (int q = 1; q < p; ++q)
          acc += in[static_cast<std::size_t>(q)][i];
        const float want = acc / 8.0f;
        for (int r = 0; r < p; ++r)
          ASSERT_EQ(got[static_cast<std::size_t>(r)][i], want) << "element " << i;
      }
    }
  }
  {
    using weft::half;
    // 8 ranks of 10000: the sum overflows half (65504), the mean does not.
    std::vector<std::vector<half>> in(p, std::vector<half>(n, half(10000.0f)));
    for (auto shape : {p2p_fused_shape::one_shot, p2p_fused_shape::two_shot}) {
      const auto got = fused_call<half, weft::op::avg>(shape, in, wd::p2p_average::prescale, 2);
      const float scaled = static_cast<float>(half(10000.0f * 0.125f)); // rounded once
      const half want = half(scaled * 8.0f);
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(static_cast<float>(got[static_cast<std::size_t>(r)][i]),
                    static_cast<float>(want));
    }
  }
  EXPECT_EQ((wd::p2p_average_of<weft::half, weft::op::avg>(true)), wd::p2p_average::prescale);
  EXPECT_EQ((wd::p2p_average_of<float, weft::op::avg>(true)), wd::p2p_average::divide);
  EXPECT_EQ((wd::p2p_average_of<float, weft::op::avg>(false)), wd::p2p_average::none);
  EXPECT_EQ((wd::p2p_average_of<float, weft::op::sum>(true)), wd::p2p_average::none);
}

TEST(p2p_fused, one_rank_copies_its_input_with_avgs_steps_in_the_copy) {
  const std::size_t n = 37;
  std::vector<std::vector<float>> in(1, std::vector<float>(n));
  for (std::size_t i = 0; i < n; ++i)
    in[0][i] = 0.3f * static_cast<float>(i) - 4.0f;
  EXPECT_EQ((fused_call<float, weft::op::sum>(p2p_fused_shape::one_rank, in, wd::p2p_average::none,
                                              2)[0]),
            in[0]);
  EXPECT_EQ((fused_call<float, weft::op::avg>(p2p_fused_shape::one_rank, in,
                                              wd::p2p_average::divide, 2)[0]),
            in[0]);
  // The copy's division itself, by 4 ranks, element by element and by packs: the reference
  // divides in float.
  alignas(16) float src[n];
  alignas(16) float dst[n];
  for (std::size_t i = 0; i < n; ++i)
    src[i] = in[0][i];
  const std::uintptr_t ops[2] = {reinterpret_cast<std::uintptr_t>(dst + 1),
                                 reinterpret_cast<std::uintptr_t>(src + 1)};
  const auto cut = weft::detail::split_for_packs(ops, 2, sizeof(float), n - 1);
  ASSERT_GT(cut.packs, 0u);
  const wd::p2p_stage_elements<float> f{dst + 1, src + 1, false, 1.0f, 4};
  run_grid(weft::detail::split_by_packs<wd::p2p_stage_elements<float>>{f, cut}, cut.indices(), 2,
           3);
  for (std::size_t i = 1; i < n; ++i)
    EXPECT_EQ(dst[i], src[i] / 4.0f) << "element " << i;
}

// --- the barriers: ranks as threads on plain atomics --------------------------------------------

struct rank_words { // one rank's flags, counters, error word and grid words
  explicit rank_words(int p)
      : flags(static_cast<std::size_t>(p)), counters(static_cast<std::size_t>(p)) {}
  std::vector<std::atomic<std::uint64_t>> flags;
  std::vector<std::atomic<std::uint64_t>> counters; // counters[rank]: the failed mark
  std::atomic<std::uint64_t> error{0};
  std::atomic<std::uint32_t> arrive{0};
  std::atomic<std::uint32_t> generation{0};
};

struct world {
  explicit world(int p, std::chrono::milliseconds timeout) : timeout(timeout) {
    for (int q = 0; q < p; ++q)
      ranks.push_back(std::make_unique<rank_words>(p));
  }
  std::vector<std::unique_ptr<rank_words>> ranks;
  std::chrono::milliseconds timeout;
  rank_words& operator[](int q) { return *ranks[static_cast<std::size_t>(q)]; }
  int size() const { return static_cast<int>(ranks.size()); }
};

// The memory policy of p2p_sync_arrive/wait/abandon on host atomics.
struct host_sync_memory {
  world& w;
  int rank;
  std::atomic<int>& gave_up;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  std::uint64_t counter(int q) const {
    return w[rank].counters[static_cast<std::size_t>(q)].load();
  }
  void set_counter(int q, std::uint64_t e) const {
    w[rank].counters[static_cast<std::size_t>(q)].store(e);
  }
  void publish(int q, std::uint64_t e) const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w[q].flags[static_cast<std::size_t>(rank)].store(e, std::memory_order_release);
  }
  // An acquire load where the device loads relaxed and fences after the wait: the same order, in a
  // form ThreadSanitizer follows (it does not model standalone fences).
  std::uint64_t flag(int q) const {
    return w[rank].flags[static_cast<std::size_t>(q)].load(std::memory_order_acquire);
  }
  bool failed(unsigned looks) const {
    return gave_up.load() != 0 || (looks % 1024 == 0 && w[rank].error.load() != 0);
  }
  bool late() const { return std::chrono::steady_clock::now() - start > w.timeout; }
  void pause() const { std::this_thread::yield(); }
  void give_up(wd::p2p_wait why, int q) const {
    if (why != wd::p2p_wait::rank_failed) {
      std::uint64_t none = 0;
      w[rank].error.compare_exchange_strong(none, wd::p2p_error_word(wd::p2p_cause_of(why), 0, q));
    }
    w[rank].counters[static_cast<std::size_t>(rank)].store(1);
    gave_up.store(1);
  }
  void acquire() const { std::atomic_thread_fence(std::memory_order_acquire); }
};

// One sync with every other rank, as p2p_sync_in_block runs it (a thread per member there; here
// every member's arrival, then every member's wait).
bool host_sync(world& w, int rank) {
  std::atomic<int> gave_up{
      wd::p2p_may_start(w[rank].counters[static_cast<std::size_t>(rank)].load()) ? 0 : 1};
  host_sync_memory m{w, rank, gave_up};
  std::vector<std::uint64_t> want(static_cast<std::size_t>(w.size()), 0);
  for (int q = 0; q < w.size(); ++q)
    if (q != rank && gave_up.load() == 0)
      want[static_cast<std::size_t>(q)] = wd::p2p_sync_arrive(m, q);
  for (int q = 0; q < w.size(); ++q)
    if (want[static_cast<std::size_t>(q)] != 0)
      (void)wd::p2p_sync_wait(m, q, want[static_cast<std::size_t>(q)]);
  const bool passed = gave_up.load() == 0;
  if (!passed)
    for (int q = 0; q < w.size(); ++q)
      if (q != rank) wd::p2p_sync_abandon(m, q);
  return passed;
}

// One grid barrier of a fused kernel, in the block `block` of `blocks` (a thread here).
bool grid_barrier(world& w, int rank, unsigned blocks) {
  rank_words& me = w[rank];
  const std::uint32_t seen = me.generation.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (wd::p2p_grid_last(me.arrive.fetch_add(1), blocks)) {
    me.arrive.store(0);
    (void)host_sync(w, rank);
    me.generation.store(seen + 1, std::memory_order_release);
  } else {
    while (!wd::p2p_grid_released(me.generation.load(std::memory_order_acquire), seen))
      std::this_thread::yield();
  }
  return wd::p2p_may_start(me.counters[static_cast<std::size_t>(rank)].load());
}

// p ranks make `calls` calls: call c is fused (one-shot-like, `blocks` blocks, each writing its
// part of the rank's staging area c % 2 before the barrier and reading every peer's whole area
// after it) when c % 3 != 2, else a step-by-step sync with the same writes and reads. Rank
// `quits` (if any) stops before call `quit_at`. Returns the data mismatches seen.
struct outcome {
  int mismatches = 0;
  std::vector<int> calls_passed;
};

outcome run_ranks(world& w, unsigned blocks, int calls, int quits = -1, int quit_at = 0) {
  const int p = w.size();
  constexpr std::size_t elements = 12;
  std::vector<std::vector<std::vector<int>>> staging(
      static_cast<std::size_t>(p),
      std::vector<std::vector<int>>(2, std::vector<int>(elements, -1)));
  std::atomic<int> mismatches{0};
  outcome o;
  o.calls_passed.assign(static_cast<std::size_t>(p), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      auto& mine = staging[static_cast<std::size_t>(r)];
      for (int c = 0; c < calls; ++c) {
        if (r == quits && c == quit_at) return;
        auto& area = mine[static_cast<std::size_t>(c % 2)];
        const auto check = [&](std::size_t from, std::size_t step) {
          for (int q = 0; q < p; ++q)
            for (std::size_t i = from; i < elements; i += step)
              if (staging[static_cast<std::size_t>(q)][static_cast<std::size_t>(c % 2)][i] !=
                  c * 100 + q)
                ++mismatches;
        };
        if (c % 3 != 2) {
          std::atomic<int> passed{0};
          std::vector<std::thread> grid;
          for (unsigned b = 0; b < blocks; ++b) {
            grid.emplace_back([&, b] {
              for (std::size_t i = b; i < elements; i += blocks)
                area[i] = c * 100 + r;
              if (!grid_barrier(w, r, blocks)) return;
              check(0, 1); // every block reads every peer's whole area
              ++passed;
            });
          }
          for (auto& t : grid)
            t.join();
          if (passed.load() != static_cast<int>(blocks)) return;
        } else {
          for (std::size_t i = 0; i < elements; ++i)
            area[i] = c * 100 + r;
          if (!host_sync(w, r)) return;
          check(0, 1);
        }
        ++o.calls_passed[static_cast<std::size_t>(r)];
      }
    });
  }
  for (auto& t : threads)
    t.join();
  o.mismatches = mismatches.load();
  return o;
}

TEST(p2p_fused, fused_barriers_and_step_by_step_syncs_count_one_epoch_per_pair_each) {
  for (int p : {2, 3, 5}) {
    for (unsigned blocks : {1u, 3u}) {
      world w(p, std::chrono::seconds(60));
      const int calls = 30;
      const outcome o = run_ranks(w, blocks, calls);
      EXPECT_EQ(o.mismatches, 0);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(o.calls_passed[static_cast<std::size_t>(r)], calls);
        EXPECT_EQ(w[r].error.load(), 0u);
        for (int q = 0; q < p; ++q) {
          // The reference: one sync per call per pair; none with itself (the failed mark).
          const std::uint64_t want = q == r ? 0 : static_cast<std::uint64_t>(calls);
          EXPECT_EQ(w[r].counters[static_cast<std::size_t>(q)].load(), want) << r << " with " << q;
          EXPECT_EQ(w[r].flags[static_cast<std::size_t>(q)].load(), want) << r << " from " << q;
        }
        EXPECT_EQ(w[r].arrive.load(), 0u);
        // A fused call (two of every three) bumps the generation once.
        EXPECT_EQ(w[r].generation.load(), static_cast<std::uint32_t>(calls - calls / 3));
      }
    }
  }
}

TEST(p2p_fused, a_rank_that_never_arrives_fails_every_peer_and_no_data_moves_past_it) {
  const int p = 4;
  world w(p, std::chrono::milliseconds(200));
  const outcome o = run_ranks(w, 3, 12, /*quits=*/3, /*quit_at=*/4);
  EXPECT_EQ(o.mismatches, 0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(o.calls_passed[static_cast<std::size_t>(r)], 4) << "rank " << r;
    EXPECT_NE(w[r].error.load(), 0u);
    EXPECT_FALSE(wd::p2p_may_start(w[r].counters[static_cast<std::size_t>(r)].load()));
    const wd::p2p_error e = wd::p2p_read_error_word(w[r].error.load());
    // Each timed out on rank 3, or found a peer's flag abandoned first.
    EXPECT_TRUE((e.cause == wd::p2p_cause::timed_out && e.peer == 3) ||
                (e.cause == wd::p2p_cause::peer_abandoned && e.peer != 3))
        << "rank " << r << " cause " << name_of(e.cause) << " peer " << e.peer;
    // Its flags at every peer are abandoned: no later sync passes on them.
    for (int q = 0; q < 3; ++q) {
      if (q != r) {
        EXPECT_TRUE(wd::p2p_is_abandoned(w[q].flags[static_cast<std::size_t>(r)].load()));
      }
    }
  }
}

TEST(p2p_fused, a_rank_that_gives_up_fails_its_peers_at_once_without_their_timeout) {
  const int p = 3;
  world w(p, std::chrono::seconds(60)); // a wait on the timeout would hang the test
  // Rank 2 failed before its first call (a sync of an earlier call gave up): its failed mark and
  // error word are set, so its next sync abandons every flag instead of publishing an epoch.
  w[2].error.store(wd::p2p_error_word(wd::p2p_cause::timed_out, 0, 1));
  w[2].counters[2].store(1);
  const auto started = std::chrono::steady_clock::now();
  const outcome o = run_ranks(w, 2, 6);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_EQ(o.mismatches, 0);
  EXPECT_EQ(o.calls_passed[2], 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(o.calls_passed[static_cast<std::size_t>(r)], 0) << "rank " << r;
    EXPECT_EQ(wd::p2p_read_error_word(w[r].error.load()).cause, wd::p2p_cause::peer_abandoned);
    EXPECT_FALSE(wd::p2p_may_start(w[r].counters[static_cast<std::size_t>(r)].load()));
  }
}

} // namespace
