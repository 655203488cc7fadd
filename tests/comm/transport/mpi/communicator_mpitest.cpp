// weft::mpi::communicator and its companions (environment, world, broadcast_bytes,
// WEFT_MPI_TRY), on real processes. ctest runs it under mpirun with 2, 3, 4 and 8 processes.
#include <weft/comm/transport/mpi.hpp>
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "support/collective_suite.hpp"

namespace {

using namespace weft;
using namespace std::chrono_literals;

static_assert(plan_executor<mpi::communicator>);
static_assert(!peer_access<mpi::communicator>, "processes cannot load from each other's buffers");

// The message of the weft::error that body() throws, or "" when it throws nothing.
template <class F>
std::string failure_of(F&& body) {
  try {
    body();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in \"" << text << "\"";
}

// Sets an environment variable for the lifetime of this object, then restores it.
class scoped_env {
public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(mpi_communicator, ranks_and_sizes_are_mpis) {
  auto& c = test::mpi_world();
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(c.rank(), rank);
  EXPECT_EQ(c.size(), size);
  EXPECT_EQ(c.native(), MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(c.world_rank(r), r);
  EXPECT_EQ(c.timeout(), test::mpi_test_timeout);
}

TEST(mpi_communicator, real_nodes_of_one_machine_are_one_node) {
  const scoped_env no_topology("WEFT_TOPOLOGY", "");
  auto c = mpi::world();
  EXPECT_FALSE(c.emulated_nodes());
  EXPECT_EQ(c.cluster().nodes(), 1);
  EXPECT_EQ(c.cluster().size(), c.size());
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(c.node_of()[static_cast<std::size_t>(r)], 0);
    EXPECT_EQ(c.devices()[static_cast<std::size_t>(r)], r);
  }
  EXPECT_EQ(c.timeout(), std::chrono::minutes(5)); // the documented default
}

// Rank 0 alone on node 0, the others on node 1: the shape "1+(p-1)", given in code.
TEST(mpi_communicator, topology_in_code_emulates_nodes) {
  const int p = test::mpi_world().size();
  auto c =
      mpi::world({.timeout = test::mpi_test_timeout,
                  .topology = topology::parse("1+" + std::to_string(p - 1) + ",ib=50GB/s:5us")});
  EXPECT_TRUE(c.emulated_nodes());
  EXPECT_EQ(c.cluster().devices_per_node(), (std::vector<int>{1, p - 1}));
  EXPECT_EQ(c.cluster().inter().kind, topology::link_kind::infiniband);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(c.node_of()[static_cast<std::size_t>(r)], r == 0 ? 0 : 1);
    EXPECT_EQ(c.devices()[static_cast<std::size_t>(r)], r);
  }
  for (std::size_t count : {std::size_t{0}, std::size_t{5}, std::size_t{1001}}) {
    test::call_and_check<algo::hierarchical<>, collective::all_reduce, std::int64_t, op::sum>(
        c, count, 0, test::pattern::exact, true);
    test::call_and_check<algo::automatic, collective::all_reduce, float, op::max>(
        c, count, 0, test::pattern::random, false);
  }
}

TEST(mpi_communicator, weft_topology_from_the_environment) {
  const int p = test::mpi_world().size();
  const std::string spec = std::to_string(p) + "x1"; // every process its own node
  const scoped_env env("WEFT_TOPOLOGY", spec.c_str());
  auto c = mpi::world({.timeout = test::mpi_test_timeout, .topology = {}});
  EXPECT_TRUE(c.emulated_nodes());
  EXPECT_EQ(c.cluster().nodes(), p);
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(c.node_of()[static_cast<std::size_t>(r)], r);
}

TEST(mpi_communicator, topology_of_another_size_is_a_clear_error) {
  const int p = test::mpi_world().size();
  const auto in_code = failure_of([&] { (void)mpi::world({.topology = topology::host(p + 1)}); });
  EXPECT_TRUE(contains(in_code, "describes " + std::to_string(p + 1) + " ranks"));
  EXPECT_TRUE(contains(in_code, "has " + std::to_string(p) + " processes"));
  const std::string spec = "2+" + std::to_string(p); // p + 2 ranks
  const scoped_env env("WEFT_TOPOLOGY", spec.c_str());
  const auto from_env = failure_of([&] { (void)mpi::world(); });
  EXPECT_TRUE(contains(
      from_env, "WEFT_TOPOLOGY=\"" + spec + "\" describes " + std::to_string(p + 2) + " ranks"));
  EXPECT_TRUE(contains(from_env, "unset WEFT_TOPOLOGY"));
}

TEST(mpi_communicator, point_to_point_every_type_in_order_with_tags) {
  auto& c = test::mpi_world();
  const int p = c.size();
  const int next = (c.rank() + 1) % p;
  const int prev = (c.rank() + p - 1) % p;
  const std::vector<double> d{1.5, -2.25, c.rank() * 1.0};
  const std::vector<half> h{half(0.5f), half(-3.0f)};
  const std::vector<bfloat16> b{bfloat16(1.0f), bfloat16(-0.125f), bfloat16(c.rank() * 1.0f)};
  const std::vector<std::int64_t> big{std::int64_t{1} << 40, -7};
  for (int k = 0; k < 40; ++k) { // small messages: all sent before any is received
    const std::array<std::int32_t, 2> out{c.rank(), k};
    send(c, std::span<const std::int32_t>(out), next, 5);
  }
  send(c, std::span(d), next, 1);
  send(c, std::span(h), next, 2);
  send(c, std::span(b), next, 3);
  send(c, std::span(big), next, 4);
  for (int k = 0; k < 40; ++k) {
    std::array<std::int32_t, 2> in{-1, -1};
    recv(c, std::span<std::int32_t>(in), prev, 5);
    EXPECT_EQ(in[0], prev);
    EXPECT_EQ(in[1], k); // in order
  }
  // Received out of the order they were sent in: tags pick the message.
  std::vector<std::int64_t> big2(2);
  std::vector<bfloat16> b2(3);
  std::vector<half> h2(2);
  std::vector<double> d2(3);
  recv(c, std::span(big2), prev, 4);
  recv(c, std::span(b2), prev, 3);
  recv(c, std::span(h2), prev, 2);
  recv(c, std::span(d2), prev, 1);
  EXPECT_EQ(d2, (std::vector<double>{1.5, -2.25, prev * 1.0}));
  EXPECT_EQ(h2[1].bits(), 0xC200); // -3.0 in binary16
  EXPECT_EQ(b2[1].bits(), 0xBE00); // -0.125 in bfloat16
  EXPECT_EQ(static_cast<float>(b2[2]), prev * 1.0f);
  EXPECT_EQ(big2, (std::vector<std::int64_t>{std::int64_t{1} << 40, -7}));
}

TEST(mpi_communicator, sendrecv_exchanges_large_messages_both_ways) {
  auto& c = test::mpi_world();
  const int p = c.size();
  const int next = (c.rank() + 1) % p;
  const int prev = (c.rank() + p - 1) % p;
  std::vector<float> out(1 << 20); // 4 MiB: beyond any eager limit, so a send alone would wait
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(c.rank() * 1000 + static_cast<int>(i % 999));
  std::vector<float> in(out.size(), -1.0f);
  c.sendrecv(std::span<const float>(out), next, std::span(in), prev, 9);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i)
    wrong += in[i] == static_cast<float>(prev * 1000 + static_cast<int>(i % 999)) ? 0 : 1;
  EXPECT_EQ(wrong, 0u);
}

// A plan step of several MPI messages: a few pieces in flight, staging slots reused, each
// reduced in place as it lands. halving_doubling's first step moves half the buffer.
TEST(mpi_communicator, steps_larger_than_one_message_go_in_pieces) {
  auto& c = test::mpi_world();
  const std::size_t floats = 5 * mpi::communicator::message_bytes / sizeof(float) + 7;
  test::call_and_check<algo::halving_doubling, collective::all_reduce, float, op::sum>(
      c, floats, 0, test::pattern::random, false);
  test::call_and_check<algo::halving_doubling, collective::all_reduce, std::int32_t, op::sum>(
      c, floats, 0, test::pattern::exact, true);
  test::call_and_check<algo::halving_doubling, collective::all_reduce, double, op::max>(
      c, floats / 2, 0, test::pattern::random, false);
}

TEST(mpi_communicator, a_receive_of_another_size_is_an_error_naming_both_sides) {
  // Communicators of their own: a receive of the wrong size fails the communicator.
  for (const bool fewer : {true, false}) {
    auto c = mpi::world(
        {.timeout = test::mpi_test_timeout, .topology = {}, .on_failure = on_failure::throw_error});
    if (c.rank() == 0) {
      const std::vector<double> three(3, 1.0);
      c.send(std::span<const double>(three), 1, 7);
    } else if (c.rank() == 1) {
      std::vector<double> v(fewer ? 5 : 2);
      const auto msg = failure_of([&] { c.recv(std::span(v), 0, 7); });
      EXPECT_TRUE(contains(msg, "recv on rank 1 (peer 0)"));
      EXPECT_TRUE(contains(msg, fewer ? "expected 5 x double but the peer sent 3"
                                      : "expected 2 x double but the peer sent more"));
      // The communicator failed: the next call throws the same error at once.
      const auto t0 = std::chrono::steady_clock::now();
      const auto again = failure_of([&] { c.recv(std::span(v), 0, 8); });
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
      EXPECT_TRUE(contains(again, "the communicator failed earlier"));
      EXPECT_TRUE(contains(again, fewer ? "expected 5 x double but the peer sent 3"
                                        : "expected 2 x double but the peer sent more"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // Every rank of the family heard of it: its next call throws rank 1's error.
    const auto later = failure_of([&] { c.barrier(); });
    EXPECT_TRUE(contains(later, "world rank 1 failed in recv")) << later;
  }
}

TEST(mpi_communicator, bad_peers_and_tags_are_errors) {
  auto& c = test::mpi_world();
  std::vector<int> v(2);
  EXPECT_TRUE(contains(failure_of([&] { c.send(std::span<const int>(v), c.size()); }),
                       "peer outside the communicator"));
  EXPECT_TRUE(contains(failure_of([&] { c.recv(std::span(v), c.rank()); }),
                       "peer outside the communicator"));
  EXPECT_TRUE(
      contains(failure_of([&] { c.send(std::span<const int>(v), (c.rank() + 1) % c.size(), -1); }),
               "tag -1 outside"));
}

TEST(mpi_communicator, barrier_waits_for_the_last_rank) {
  auto& c = test::mpi_world();
  c.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (c.rank() == c.size() - 1) std::this_thread::sleep_for(300ms);
  c.barrier();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
}

// Even and odd ranks, each group in reverse order: as MPI_Comm_split orders them, by key.
TEST(mpi_communicator, split_orders_by_key_and_keeps_placement) {
  const int p = test::mpi_world().size();
  auto c = mpi::world({.timeout = test::mpi_test_timeout,
                       .topology = topology::parse("1+" + std::to_string(p - 1))});
  auto sub = c.split(c.rank() % 2, -c.rank());
  const int mine = (p - (c.rank() % 2) + 1) / 2; // ranks of my parity
  ASSERT_EQ(sub.size(), mine);
  EXPECT_NE(sub.native(), MPI_COMM_NULL);
  int mpi_rank = -1;
  MPI_Comm_rank(sub.native(), &mpi_rank);
  EXPECT_EQ(sub.rank(), mpi_rank);
  for (int r = 0; r < sub.size(); ++r) {
    // Highest key first: rank r of the split is the (r+1)-th largest world rank of my parity.
    const int w = c.rank() % 2 + 2 * (sub.size() - 1 - r);
    EXPECT_EQ(sub.world_rank(r), w);
    EXPECT_EQ(sub.devices()[static_cast<std::size_t>(r)], w);
    EXPECT_EQ(sub.node_of()[static_cast<std::size_t>(r)], w == 0 ? 0 : 1);
  }
  EXPECT_EQ(sub.world_rank(sub.rank()), c.rank());
  EXPECT_TRUE(sub.cluster() == c.cluster());
  test::call_and_check<algo::automatic, collective::all_reduce, std::int32_t, op::sum>(
      sub, 777, 0, test::pattern::exact, false);
  test::call_and_check<algo::hierarchical<algo::ring, algo::tree>, collective::all_reduce, float,
                       op::sum>(sub, 3001, 0, test::pattern::random, true);
  auto moved = std::move(sub); // a moved communicator keeps working
  test::call_and_check<algo::ring, collective::broadcast, double, op::sum>(
      moved, 100, moved.size() - 1, test::pattern::random, false);
}

TEST(mpi_communicator, messages_on_the_programs_own_communicator_never_match_wefts) {
  auto& c = test::mpi_world();
  const int p = c.size();
  const int next = (c.rank() + 1) % p;
  const int prev = (c.rank() + p - 1) % p;
  // A raw MPI message with tag 0 on the user's communicator, sent first, and a weft message
  // with the same tag: each arrives where it was addressed.
  int raw = 1000 + c.rank();
  MPI_Request req = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Isend(&raw, 1, MPI_INT, next, 0, c.native(), &req), MPI_SUCCESS);
  const std::array<int, 1> out{2000 + c.rank()};
  c.send(std::span<const int>(out), next, 0);
  std::array<int, 1> in{-1};
  c.recv(std::span<int>(in), prev, 0);
  int raw_in = -1;
  ASSERT_EQ(MPI_Recv(&raw_in, 1, MPI_INT, prev, 0, c.native(), MPI_STATUS_IGNORE), MPI_SUCCESS);
  ASSERT_EQ(MPI_Wait(&req, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_EQ(in[0], 2000 + prev);
  EXPECT_EQ(raw_in, 1000 + prev);
}

TEST(mpi_communicator, broadcast_bytes_carries_an_opaque_id) {
  auto& c = test::mpi_world();
  for (int root : {0, c.size() - 1}) {
    std::array<std::byte, 128> id{}; // the size of an ncclUniqueId
    if (c.rank() == root) {
      for (std::size_t i = 0; i < id.size(); ++i)
        id[i] = static_cast<std::byte>((i * 37 + 11 + root) & 0xff);
    }
    mpi::broadcast_bytes(c, id, root);
    for (std::size_t i = 0; i < id.size(); ++i) {
      ASSERT_EQ(id[i], static_cast<std::byte>((i * 37 + 11 + root) & 0xff))
          << "byte " << i << " root " << root;
    }
  }
  std::array<std::byte, 4> small{};
  EXPECT_TRUE(contains(failure_of([&] { mpi::broadcast_bytes(c, small, c.size()); }),
                       "root " + std::to_string(c.size())));
}

TEST(mpi_communicator, mpi_errors_name_the_call_the_place_and_the_error) {
  MPI_Comm dup = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  auto c = mpi::communicator::adopt(dup, {.timeout = test::mpi_test_timeout, .topology = {}});
  int errhandler_returns = 0;
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  ASSERT_EQ(MPI_Comm_get_errhandler(c.native(), &h), MPI_SUCCESS);
  errhandler_returns = h == MPI_ERRORS_RETURN ? 1 : 0;
  MPI_Errhandler_free(&h);
  EXPECT_EQ(errhandler_returns, 1) << "adopt must set MPI_ERRORS_RETURN";
  int x = 0;
  const int bad = c.size() + 5;
  const auto msg = failure_of(
      [&] { WEFT_MPI_TRY(MPI_Send(&x, 1, MPI_INT, bad, 0, c.native()), "probe", c.rank(), bad); });
  EXPECT_TRUE(contains(msg, "weft: probe on rank " + std::to_string(c.rank()) + " (peer " +
                                std::to_string(bad) + ")"));
  EXPECT_TRUE(contains(
      msg, "MPI_Send(&x, 1, MPI_INT, bad, 0, c.native()) failed at communicator_mpitest.cpp:"));
  EXPECT_TRUE(contains(msg, "MPI_ERR_RANK"));
  const auto bare = failure_of([&] { WEFT_MPI_TRY(MPI_Send(&x, -1, MPI_INT, 0, 0, c.native())); });
  EXPECT_TRUE(contains(bare, "weft: MPI_Send("));
  EXPECT_TRUE(contains(bare, "MPI_ERR_COUNT"));
}

TEST(mpi_communicator, a_rank_that_never_joins_is_a_timeout_naming_the_operation) {
  // A communicator of its own: after a timeout it must not be used again.
  auto c = mpi::world({.timeout = 1000ms, .topology = {}, .on_failure = on_failure::throw_error});
  std::vector<float> v(1000, 1.0f);
  std::string msg;
  if (c.rank() != 1) { // rank 1 stalls: it does not call the collective at all
    const auto t0 = std::chrono::steady_clock::now();
    msg = failure_of([&] { all_reduce<algo::ring>(c, std::span(v)); });
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(waited, 900ms);
    EXPECT_LT(waited, 20s);
    EXPECT_TRUE(contains(msg, "all_reduce on rank " + std::to_string(c.rank()) + " (peer "));
    EXPECT_TRUE(contains(msg, "timed out after 1000 ms"));
    // Every waiting rank names rank 1, the one that never came, not only its neighbour.
    EXPECT_TRUE(contains(msg, "world rank 1 stalled")) << msg;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Rank 1 arrives late: the communicator failed meanwhile, and its call says so at once.
  const auto t0 = std::chrono::steady_clock::now();
  const auto late = failure_of([&] { all_reduce<algo::ring>(c, std::span(v)); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  EXPECT_TRUE(contains(late, "the communicator failed earlier")) << late;
  EXPECT_TRUE(contains(late, "world rank 1 stalled")) << late;
}

TEST(mpi_communicator, direct_plans_are_refused_with_a_reason) {
  // One node, so that every rank's plan loads from its peers and every rank refuses it.
  auto c = mpi::world(
      {.timeout = test::mpi_test_timeout, .topology = topology::host(test::mpi_world().size())});
  std::vector<float> v(64, 1.0f);
  // hierarchical<direct, ...> compiles (its peer access is in its plans) but cannot run here.
  const auto msg = failure_of(
      [&] { all_reduce<algo::hierarchical<algo::direct, algo::ring>>(c, std::span(v)); });
  EXPECT_TRUE(contains(msg, "MPI processes do not share memory"));
}

TEST(mpi_communicator, check_calls_finds_ranks_that_disagree) {
  auto& c = test::mpi_world();
  check_calls(true);
  std::vector<int> v(c.rank() == 1 ? 50 : 100, 1);
  const auto msg = failure_of([&] { all_reduce<algo::ring>(c, std::span(v)); });
  check_calls(false);
  EXPECT_TRUE(contains(msg, "the ranks called different collectives"));
  EXPECT_TRUE(contains(msg, "rank 1 differs from rank 0 in count"));
  test::call_and_check<algo::ring, collective::all_reduce, std::int32_t, op::sum>(
      c, 100, 0, test::pattern::exact,
      false); // still usable
}

TEST(mpi_communicator, a_timeout_names_the_sequence_number_and_plan_step) {
  auto c = mpi::world({.timeout = 1000ms, .topology = {}, .on_failure = on_failure::throw_error});
  std::vector<float> v(1000, 1.0f);
  all_reduce<algo::ring>(c, std::span(v)); // #1, with everyone
  c.barrier();                             // #2
  EXPECT_EQ(c.sequence(), 2u);
  EXPECT_FALSE(c.progress().in_operation());
  std::string msg;
  if (c.rank() != 1) { // rank 1 does not join #3
    msg = failure_of([&] { all_reduce<algo::ring>(c, std::span(v)); });
    EXPECT_TRUE(contains(msg, "timed out after 1000 ms"));
    // The ring's plan: a round and a step of it, on this rank's third operation.
    EXPECT_TRUE(contains(msg, " in all_reduce #3 round "));
    EXPECT_TRUE(contains(msg, " step "));
    const auto p = c.progress(); // left where it failed
    EXPECT_EQ(p.operation, "all_reduce");
    EXPECT_EQ(p.sequence, 3u);
    EXPECT_GT(p.steps, 0u);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(mpi_communicator, set_check_calls_checks_this_communicator_only) {
  auto& world = test::mpi_world();
  auto c = world.split(0, world.rank());
  c.set_check_calls(true);
  EXPECT_TRUE(c.split(0, c.rank()).check_calls()) << "a split inherits the check";
  std::vector<int> v(c.rank() == 1 ? 50 : 100, 1);
  const auto msg = failure_of([&] { all_reduce<algo::ring>(c, std::span(v)); });
  EXPECT_TRUE(contains(msg, "no data moved"));
  EXPECT_TRUE(contains(
      msg, "rank 1 differs from rank 0 in count: it called all_reduce<ring> of 50 x int32"));
  for (int x : v)
    EXPECT_EQ(x, 1) << "data moved";
}

TEST(mpi_environment, reports_mpi_already_initialized) {
  const mpi::environment env; // main() made the one that owns MPI
  EXPECT_FALSE(env.owns());
  EXPECT_GE(env.thread_level(), MPI_THREAD_SERIALIZED);
}

} // namespace

namespace {

// A sum whose first use on a rank takes `delay`: a rank stalled inside a call.
struct slow_sum {
  static constexpr std::string_view name = "slow_sum";
  std::shared_ptr<bool> slept = std::make_shared<bool>(false);
  std::chrono::milliseconds delay{};
  template <class A>
  A operator()(A a, A b) const {
    if (!*slept) {
      *slept = true;
      std::this_thread::sleep_for(delay);
    }
    return a + b;
  }
};

// The first `n` ranks of a fresh throw_error world, or nothing on the others.
std::optional<mpi::communicator> first_ranks(int n, std::chrono::milliseconds timeout) {
  auto w = mpi::world({.timeout = timeout, .topology = {}, .on_failure = on_failure::throw_error});
  auto c = w.split(w.rank() < n ? 0 : 1, w.rank());
  if (w.rank() >= n) return std::nullopt;
  return c;
}

} // namespace

TEST(mpi_communicator, a_timeout_names_the_rank_still_outstanding_not_the_first_one_waited_for) {
  // Rank 0 sends to ranks 1 and 2 in one round. Rank 1 takes its message a little late and
  // goes back to its own code; rank 2 sleeps through the deadline. Rank 0's wait began on
  // rank 1, but at its deadline only rank 2 is outstanding: the verdict must name rank 2.
  if (test::mpi_world().size() < 3) GTEST_SKIP() << "needs 3 processes";
  auto c = first_ranks(3, 1000ms);
  if (c) {
    const int r = c->rank();
    constexpr std::size_t n = 4096; // 16 KiB: above credit_bytes
    std::vector<float> in(n, 1.0f), out(n, 0.0f);
    plan pl(plan_request{.coll = collective::broadcast,
                         .size = 3,
                         .rank = r,
                         .count = n,
                         .root = 0,
                         .node_of = {},
                         .element_size = 4});
    if (r == 0) {
      pl.send(1, buffer::input, 0, n);
      pl.send(2, buffer::input, 0, n);
    } else {
      pl.recv(0, buffer::output, 0, n);
    }
    if (r == 1) std::this_thread::sleep_for(100ms);
    if (r == 2) std::this_thread::sleep_for(3s);
    const auto msg =
        failure_of([&] { c->execute(pl, in.data(), n, out.data(), n, op::sum{}, "broadcast"); });
    if (r == 0) {
      EXPECT_TRUE(contains(msg, "on rank 0 (peer 2)")) << msg;
      EXPECT_TRUE(contains(msg, "world rank 2 stalled")) << msg;
    }
    if (r == 1) {
      EXPECT_TRUE(msg.empty()) << msg;
      std::this_thread::sleep_for(3s); // its own code, outside weft, while rank 0 investigates
      const auto later = failure_of([&] { c->barrier(); });
      EXPECT_TRUE(contains(later, "world rank 2 stalled")) << later;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(mpi_communicator, a_rank_stalled_inside_a_call_throws_when_it_comes_back) {
  // Rank 0's plan has a slow reduction after its send; rank 1 times out and cancels its
  // receive. Rank 0's credit from rank 1 is older than the failure: coming back, it must
  // throw the verdict, not hand MPI its buffer for a receive that is gone (which, under
  // throw_error, would leave it no way but to end the job).
  auto c = first_ranks(2, 1000ms);
  if (c) {
    const int r = c->rank();
    constexpr std::size_t n = 4096;
    std::vector<float> in(n, 1.0f), out(n, 0.0f);
    plan pl(plan_request{.coll = collective::broadcast,
                         .size = 2,
                         .rank = r,
                         .count = n,
                         .root = 0,
                         .node_of = {},
                         .element_size = 4});
    if (r == 0) {
      pl.send(1, buffer::input, 0, n);
      pl.reduce(buffer::output, 0, buffer::output, 0, 1);
    } else {
      pl.recv(0, buffer::output, 0, n);
    }
    if (r == 1) std::this_thread::sleep_for(100ms);
    const auto msg = failure_of([&] {
      c->execute(pl, in.data(), n, out.data(), n,
                 slow_sum{.delay = std::chrono::milliseconds(3000)}, "broadcast");
    });
    EXPECT_TRUE(contains(msg, "world rank " + std::to_string(c->world_rank(0)) + " stalled"))
        << msg;
    if (r == 0) {
      EXPECT_TRUE(contains(msg, "the communicator failed earlier")) << msg;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
