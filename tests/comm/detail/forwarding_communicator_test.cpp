// The wrappers' forwarding (detail/forwarding_communicator.hpp), on a fake communicator of one
// rank: an all-reduce through traced<> or checked_calls<> reaches the fake's execute_whole as
// it does on the bare fake, traced records a call run whole once and a declined one once (by
// the execute that follows), and what the fake lacks the wrappers lack too.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/checked_calls.hpp>
#include <weft/comm/traced.hpp>
#include <weft/core/error.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

namespace {

using namespace weft;

// One rank, peer access, no data moved by a plan: execute() writes in + 1 to out, and, where
// Whole, execute_whole() writes 10 * in for the calls it takes (all of them where `whole`, none
// otherwise), as weft::cuda::p2p's fused kernels take some plans whole. It counts what reaches it.
template <bool Whole>
struct fake {
  static constexpr bool peer_access = true;

  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  void barrier() {}
  [[nodiscard]] fake split(int, int) { return *this; }
  [[nodiscard]] const std::vector<int>& node_of() const { return nodes; }

  template <class T>
  void send(std::span<T>, int, int = 0) {
    throw error("fake: one rank sends nothing");
  }
  template <class T>
  void recv(std::span<T>, int, int = 0) {
    throw error("fake: one rank receives nothing");
  }

  template <class T, class Op>
  void execute(const plan&, const T* in, std::size_t in_count, T* out, std::size_t, const Op&,
               std::string_view) {
    ++executed;
    for (std::size_t i = 0; i < in_count; ++i)
      out[i] = in[i] + 1;
  }
  template <class T, class Op>
  bool execute_whole(const plan&, const T* in, std::size_t in_count, T* out, std::size_t, const Op&,
                     std::string_view) requires Whole {
    ++asked_whole;
    if (!whole) return false;
    for (std::size_t i = 0; i < in_count; ++i)
      out[i] = 10 * in[i];
    return true;
  }

  std::vector<int> nodes{0};
  bool whole = true;
  int executed = 0;
  int asked_whole = 0;
};

// Whether W has each member that forwarding_communicator adds only where the wrapped
// communicator has it.
template <class W>
constexpr bool has_execute_whole = requires(W& w, const plan& p, const float* in, float* out) {
  w.execute_whole(p, in, std::size_t{}, out, std::size_t{}, op::sum{}, std::string_view{});
};
template <class W>
constexpr bool has_any_optional_member = requires(const W& c) {
  c.cluster();
}
|| requires(const W& c) { c.devices(); }
|| requires(const W& c) { c.stream(); }
|| requires(const W& c) { c.plan_round_seconds(); }
|| requires(const W& c) { c.measures_automatic(); }
|| requires(W& c) { c.measured_prices_of(collective::all_reduce); }
|| requires(W& c) { c.measure_prices(collective::all_reduce, true, true); }
|| requires(W& c, const plan_request& q) {
  c.template vendor_price<collective::all_reduce, float, op::sum>(q);
}
|| requires(W& c, const float* in, float* out) {
  c.template vendor<collective::all_reduce>(in, std::size_t{}, out, std::size_t{}, std::size_t{}, 0,
                                            op::sum{});
}
|| requires(W& c, float* out) { c.divide(out, std::size_t{}); }
|| requires(W& c, const float* in) { c.scaled_by_ranks(in, std::size_t{}, std::string_view{}); }
|| requires(W& c, std::span<const float> d) { c.post(d, 0, 0); }
|| requires(W& c) { c.flush(); }
|| requires(W& c, std::span<const float> o, std::span<float> i) { c.sendrecv(o, 0, i, 0, 0); };

static_assert(has_execute_whole<fake<true>> && !has_execute_whole<fake<false>>);
static_assert(has_execute_whole<traced<fake<true>>> &&
              has_execute_whole<checked_calls<fake<true>>>);
static_assert(!has_execute_whole<traced<fake<false>>> &&
              !has_execute_whole<checked_calls<fake<false>>>);
static_assert(!has_any_optional_member<fake<true>>);
static_assert(!has_any_optional_member<traced<fake<true>>>);
static_assert(!has_any_optional_member<checked_calls<fake<true>>>);
// check_calls: traced forwards it where the fake has it (it has none); checked_calls answers.
template <class W>
constexpr bool has_check_calls = requires(const W& w) {
  w.check_calls();
};
static_assert(!has_check_calls<traced<fake<true>>> && has_check_calls<checked_calls<fake<true>>>);
static_assert(checked_calls<fake<true>>::check_calls());
// What the fake declares, the wrappers declare.
static_assert(peer_access<traced<fake<true>>> && peer_access<checked_calls<fake<false>>>);
static_assert(traced<fake<true>>::messages && !traced<fake<true>>::measure_prices_with_vendor);
// A bound on unreceived messages (weft::local's channels), where the fake declares one.
template <class W>
constexpr bool has_message_bound = requires {
  W::queued_messages_per_peer;
};
struct bounded : fake<true> {
  static constexpr std::size_t queued_messages_per_peer = 5;
  [[nodiscard]] bounded split(int, int) { return *this; }
};
static_assert(!has_message_bound<traced<fake<true>>> &&
              !has_message_bound<checked_calls<fake<true>>>);
static_assert(traced<bounded>::queued_messages_per_peer == 5 &&
              checked_calls<bounded>::queued_messages_per_peer == 5);

TEST(forwarding_communicator, traced_records_a_call_run_whole_once) {
  traced<fake<true>> t(fake<true>{}, "tp");
  std::vector<float> v{1, 2, 3};
  all_reduce<algo::direct>(t, std::span(v));
  EXPECT_EQ(v, (std::vector<float>{10, 20, 30})); // the fake's whole call, and nothing after it
  EXPECT_EQ(t.inner().asked_whole, 1);
  EXPECT_EQ(t.inner().executed, 0);
  const std::vector<traced_op> want = {{collective::all_reduce, 3, dtype::float32, "tp"}};
  EXPECT_EQ(t.ops(), want);
  const auto spans = t.spans();
  ASSERT_EQ(spans.size(), 1U);
  EXPECT_EQ(spans[0].what, "all_reduce");
  EXPECT_EQ(spans[0].bytes, 3 * sizeof(float));
}

TEST(forwarding_communicator, traced_records_a_declined_whole_call_once_by_its_execute) {
  fake<true> f;
  f.whole = false;
  traced<fake<true>> t(f, "dp");
  std::vector<double> v{1, 2};
  all_reduce<algo::direct>(t, std::span(v));
  EXPECT_EQ(v, (std::vector<double>{2, 3})); // the fake's execute
  EXPECT_EQ(t.inner().asked_whole, 1);
  EXPECT_EQ(t.inner().executed, 1);
  const std::vector<traced_op> want = {{collective::all_reduce, 2, dtype::float64, "dp"}};
  EXPECT_EQ(t.ops(), want);
  EXPECT_EQ(t.spans().size(), 1U);
}

TEST(forwarding_communicator, checked_calls_and_the_bare_fake_take_the_same_path) {
  fake<true> bare;
  checked_calls<fake<true>> checked(fake<true>{});
  std::vector<int> a{4, 5}, b{4, 5};
  all_reduce<algo::direct>(bare, std::span(a));
  all_reduce<algo::direct>(checked, std::span(b));
  EXPECT_EQ(a, (std::vector<int>{40, 50}));
  EXPECT_EQ(b, a);
  EXPECT_EQ(checked.inner().asked_whole, 1);
  EXPECT_EQ(checked.inner().executed, 0);
  // Without execute_whole, every wrapper runs the plan by execute.
  traced<fake<false>> plain(fake<false>{});
  all_reduce<algo::direct>(plain, std::span(b));
  EXPECT_EQ(b, (std::vector<int>{41, 51}));
  EXPECT_EQ(plain.inner().executed, 1);
  EXPECT_EQ(plain.ops().size(), 1U);
}

} // namespace
