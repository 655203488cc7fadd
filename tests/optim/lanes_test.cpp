// The host check of data_parallel's device path (include/weft/cuda/data_parallel.cuh). On a
// device every buffer operation is queued on a stream named by its lane: `main` (the user's
// stream) or `side` (the collectives' stream). A mislabelled one is a race there that no host
// loop shows. Here the same labels are checked against where the host runs the work: with
// overlap, side-lane work must run on the progress thread (inside a queued job, as on the side
// stream), main-lane work on the rank's own thread. A memory policy for one communicator type
// (weft::traced<local::communicator>) wraps the host one and records every call that runs on
// the wrong thread; training must also still match the full-batch reference.
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "optim/support.hpp"

namespace lane_probe {

using comm = weft::traced<weft::local::communicator>;

struct record {
  std::mutex mutex;
  std::vector<std::string> wrong; // "<call> on the <lane> lane, run on the <other> thread"
  std::atomic<long> main_calls{0}, side_calls{0};
  std::atomic<long> adds{0}; // add calls (reduce_bucket's accumulation into the shard)
};
inline record& log() {
  static record r;
  return r;
}

} // namespace lane_probe

namespace weft::optim::detail {

template <>
class dp_memory<lane_probe::comm> : public dp_memory<weft::local::communicator> {
  using base = dp_memory<weft::local::communicator>;
  using comm = lane_probe::comm;

public:
  explicit dp_memory(comm&) : owner_(std::this_thread::get_id()) {}

  [[nodiscard]] comm split(comm& c, int color, int key) { return c.split(color, key); }

  template <class T>
  void zeros(buffer<T>& b, std::size_t n, lane l) {
    check(l, "zeros");
    base::zeros(b, n, l);
  }
  template <class T>
  void release(buffer<T>& b, lane l) {
    check(l, "release");
    base::release(b, l);
  }
  template <class T>
  void fill_zero(T* p, std::size_t n, lane l) {
    check(l, "fill_zero");
    base::fill_zero(p, n, l);
  }
  template <class T>
  void copy(T* dst, const T* src, std::size_t n, lane l) {
    check(l, "copy");
    base::copy(dst, src, n, l);
  }
  template <class T>
  void add(T* dst, const T* src, std::size_t n, lane l) {
    check(l, "add");
    ++lane_probe::log().adds;
    base::add(dst, src, n, l);
  }
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) {
    check(lane::main, "upload");
    base::upload(dst, src, n);
  }
  template <class T>
  void download(T* dst, const T* src, std::size_t n) {
    check(lane::main, "download");
    base::download(dst, src, n);
  }
  template <class U>
  void update(const U& u, std::size_t n, int threads) {
    check(lane::main, "update");
    base::update(u, n, threads);
  }
  template <class P>
  squares<P> prepare_squares(std::vector<norm_range<P>> ranges) {
    check(lane::main, "prepare_squares");
    return base::prepare_squares(std::move(ranges));
  }
  template <class P>
  void sum_squares(const squares<P>& s, double* out) {
    check(lane::main, "sum_squares");
    base::sum_squares(s, out);
  }
  template <class F>
  void run(comm& c, F&& f) {
    check(lane::side, "run");
    std::forward<F>(f)(c);
  }

private:
  void check(lane l, const char* what) {
    auto& r = lane_probe::log();
    const bool on_owner = std::this_thread::get_id() == owner_;
    (l == lane::main ? r.main_calls : r.side_calls)++;
    if (on_owner != (l == lane::main)) {
      std::lock_guard lock(r.mutex);
      r.wrong.push_back(std::string(what) + " on the " + (l == lane::main ? "main" : "side") +
                        " lane, run on the " + (on_owner ? "rank's" : "progress") + " thread");
    }
  }
  std::thread::id owner_;
};

} // namespace weft::optim::detail

namespace {

using namespace weft;
using namespace weft::test::optim;
namespace wo = weft::optim;

constexpr int batch = 12;
constexpr int steps = 4;

template <class Policy, class P = float>
std::vector<float> train_probed(const model& m, int dp, float clip, bool scaling) {
  wo::data_parallel_options o{
      .bucket_elements = 20, .overlap = true, .max_grad_norm = clip, .inner_size = 1};
  o.loss_scaling = scaling;
  o.scaling.initial = 256.0f;
  return train_parallel<Policy, P>(
      m, batch, dp, sgd_rule(), steps, 1.0f / batch, o,
      [](weft::local::communicator& c) { return lane_probe::comm(std::move(c), "dp"); });
}

template <class Policy, class P = float>
void check_lanes(float clip, bool scaling) {
  const l1_linear m(batch);
  auto& r = lane_probe::log();
  r.wrong.clear();
  r.main_calls = 0;
  r.side_calls = 0;
  const auto expected =
      rounded_to<P>(train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, clip));
  for (int dp : {2, 3})
    EXPECT_EQ((train_probed<Policy, P>(m, dp, clip, scaling)), expected) << "dp " << dp;
  std::string wrong;
  for (const auto& w : r.wrong)
    wrong += "\n  " + w;
  EXPECT_TRUE(r.wrong.empty()) << r.wrong.size() << " calls on the wrong lane:" << wrong;
  // Both lanes saw work: the check above looked at something.
  EXPECT_GT(r.main_calls.load(), 0);
  EXPECT_GT(r.side_calls.load(), 0);
}

TEST(data_parallel_lanes, zero0) { check_lanes<wo::zero<0>>(0.5f, false); }
TEST(data_parallel_lanes, zero1) { check_lanes<wo::zero<1>>(0.5f, false); }
TEST(data_parallel_lanes, zero2) { check_lanes<wo::zero<2>>(0.5f, false); }
TEST(data_parallel_lanes, zero3) { check_lanes<wo::zero<3>>(0.5f, false); }
TEST(data_parallel_lanes, hybrid_zero3) {
  check_lanes<wo::hybrid<wo::zero<3>, wo::zero<0>>>(0.5f, false);
}
TEST(data_parallel_lanes, half_with_loss_scaling) {
  check_lanes<wo::zero<2>, weft::half>(0.0f, true);
}

// reduce_bucket: each micro-batch's bucket handed from the main lane to a side-lane job that
// reduce-scatters it and adds the result into the shard; hybrid's replica all-reduce at step().
// The result is the sum by hand (3 micro-batches of 1 + 2 per rank pair, two pairs).
TEST(data_parallel_lanes, reduce_bucket_every_micro_batch) {
  auto& r = lane_probe::log();
  r.wrong.clear();
  r.main_calls = 0;
  r.side_calls = 0;
  r.adds = 0;
  wo::param_set ps;
  ps.add("a", {6});
  weft::local::run(4, [&](weft::local::communicator& world) {
    auto c = lane_probe::comm(std::move(world), "dp");
    auto opt = wo::make_data_parallel<wo::hybrid<wo::zero<3>, wo::zero<0>>>(
        c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 6, .overlap = true, .inner_size = 2});
    opt->set_parameters(std::vector<float>(6, 0.0f));
    for (int k = 0; k < 3; ++k) {
      for (auto& x : opt->grad("a"))
        x = static_cast<float>(c.rank() % 2 + 1);
      opt->reduce_bucket(0);
    }
    (void)opt->step();
    const auto p = opt->gather_parameters();
    for (std::size_t i = 0; i < p.size(); ++i)
      EXPECT_EQ(p[i], -18.0f) << "a[" << i << "] on rank " << c.rank();
  });
  std::string wrong;
  for (const auto& w : r.wrong)
    wrong += "\n  " + w;
  EXPECT_TRUE(r.wrong.empty()) << r.wrong.size() << " calls on the wrong lane:" << wrong;
  EXPECT_EQ(r.adds.load(), 4 * 2) << "rounds 2 and 3 add on each of the 4 ranks";
}

} // namespace
