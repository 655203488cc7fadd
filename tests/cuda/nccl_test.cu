// weft::cuda::nccl and algo::vendor. The host tests (type and operator mapping, error text,
// placement, the device plan layout) run everywhere. The device tests skip without a GPU;
// with one they run size-1 communicators, and with two or more GPUs the multi-rank tests
// run one host thread per rank over min(4, devices) GPUs (ncclCommInitAll). Every result is
// compared with the serial reference of tests/support/reference.hpp.
#include <weft/comm/traced.hpp>
#include <weft/cuda/nccl.cuh>
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/cuda.cuh"
#include "support/reference.hpp"

namespace {

namespace algo = weft::algo;
namespace op = weft::op;
namespace nccl = weft::cuda::nccl;
using nccl::communicator;
using weft::buffer;
using weft::collective;
using weft::cuda::device_buffer;
using weft::test::pattern;

// Expects `f` to throw weft::error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string_view> parts) {
  try {
    f();
    ADD_FAILURE() << "no weft::error thrown";
  } catch (const weft::error& e) {
    const std::string what = e.what();
    for (std::string_view part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "\"" << part << "\" not in: " << what;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host tests

TEST(nccl, every_element_type_has_its_nccl_type) {
  using weft::cuda::nccl_type_of;
  static_assert(nccl_type_of<float> == ncclFloat32);
  static_assert(nccl_type_of<double> == ncclFloat64);
  static_assert(nccl_type_of<weft::half> == ncclFloat16);
  static_assert(nccl_type_of<weft::bfloat16> == ncclBfloat16);
  static_assert(nccl_type_of<std::int32_t> == ncclInt32);
  static_assert(nccl_type_of<std::int64_t> == ncclInt64);
  static_assert(nccl_type_of<const float> == ncclFloat32);
  const std::pair<weft::dtype, ncclDataType_t> table[] = {
      {weft::dtype::float32, ncclFloat32}, {weft::dtype::float64, ncclFloat64},
      {weft::dtype::float16, ncclFloat16}, {weft::dtype::bfloat16, ncclBfloat16},
      {weft::dtype::int32, ncclInt32},     {weft::dtype::int64, ncclInt64}};
  for (const auto& [t, n] : table)
    EXPECT_EQ(weft::cuda::nccl_type(t), n) << weft::name_of(t);
}

struct user_max {
  template <class A>
  WEFT_HOST_DEVICE A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};
struct derived_sum : op::sum {};

TEST(nccl, built_in_operators_map_to_nccl_and_user_functors_do_not) {
  using weft::cuda::nccl_op_of;
  using weft::cuda::nccl_reduction;
  static_assert(nccl_op_of<op::sum> == ncclSum);
  static_assert(nccl_op_of<op::prod> == ncclProd);
  static_assert(nccl_op_of<op::min> == ncclMin);
  static_assert(nccl_op_of<op::max> == ncclMax);
  static_assert(nccl_op_of<op::avg> == ncclAvg);
  static_assert(!nccl_reduction<user_max>);
  static_assert(!nccl_reduction<derived_sum>); // NCCL cannot know what a subclass means
}

TEST(nccl, automatic_weighs_nccls_own_collective_for_its_operators_only) {
  using comm = weft::cuda::nccl::communicator;
  static_assert(weft::detail::prices_vendor<comm, collective::all_reduce, float, op::sum>);
  static_assert(weft::detail::prices_vendor<comm, collective::all_gather, weft::half, op::avg>);
  static_assert(!weft::detail::prices_vendor<comm, collective::all_reduce, float, user_max>);
  // A plan round is an NCCL kernel launch, priced as the NCCL model prices one.
  static_assert(comm::plan_round_seconds() == weft::cost_model::nccl_plan_round_seconds);
  // The same check traced<> forwards.
  static_assert(
      weft::detail::prices_vendor<weft::traced<comm>, collective::all_reduce, float, op::sum>);
}

TEST(nccl, nccl_try_names_the_call_where_and_the_result) {
  const auto fails = [] { return ncclInvalidUsage; };
  expect_error([&] { WEFT_NCCL_TRY(fails()); },
               {"weft: fails() failed at ", "nccl_test.cu:", "ncclInvalidUsage ("});
  int n = 0;
  // A real NCCL call that fails without any device: a null communicator.
  expect_error([&] { WEFT_NCCL_TRY(ncclCommCount(nullptr, &n)); },
               {"ncclCommCount(nullptr, &n) failed", "ncclInvalidArgument ("});
}

TEST(nccl, transport_errors_name_operation_rank_peer_and_call) {
  expect_error(
      [] { weft::cuda::detail::nccl_check(ncclSystemError, "ncclSend", "all_reduce", 2, 3); },
      {"weft: all_reduce on rank 2 (peer 3): ncclSend failed: ncclSystemError ("});
  expect_error(
      [] { weft::cuda::detail::cuda_check(cudaErrorInvalidValue, "cudaMemcpyAsync", "recv", 1); },
      {"weft: recv on rank 1: cudaMemcpyAsync failed: cudaErrorInvalidValue ("});
}

TEST(nccl, models_the_communicator_concepts_without_peer_access) {
  static_assert(weft::communicator<communicator>);
  static_assert(weft::plan_executor<communicator>);
  static_assert(!weft::peer_access<communicator>);
  static_assert(!std::is_copy_constructible_v<communicator>);
  static_assert(std::is_nothrow_move_constructible_v<communicator>);
}

TEST(nccl, vendor_is_a_policy_only_nccl_serves) {
  EXPECT_EQ(algo::vendor::name, "vendor");
  static_assert(algo::vendor::serves(collective::all_to_all) &&
                algo::vendor::serves(collective::reduce));
  static_assert(
      weft::detail::vendor_collective<communicator, collective::all_reduce, float, op::sum>);
  static_assert(
      weft::detail::vendor_collective<communicator, collective::all_to_all, std::int64_t, op::sum>);
  static_assert(!weft::detail::vendor_collective<weft::local::communicator, collective::all_reduce,
                                                 float, op::sum>);
}

TEST(nccl, places_every_rank_on_one_node_by_default) {
  const auto pl = weft::cuda::detail::place_ranks(4, std::nullopt, nullptr, {});
  EXPECT_FALSE(pl.emulated);
  EXPECT_EQ(pl.cluster->devices_per_node(), std::vector<int>{4});
  EXPECT_EQ(pl.cluster->intra().kind, weft::topology::link_kind::nvlink);
  EXPECT_EQ(pl.cluster->inter().kind, weft::topology::link_kind::infiniband);
  EXPECT_EQ(pl.devices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(pl.node_of, (std::vector<int>{0, 0, 0, 0}));
}

TEST(nccl, groups_ranks_by_node_label_nodes_by_lowest_rank) {
  // Labels 7, 3, 7, 3, 5: node 0 = ranks {0, 2}, node 1 = {1, 3}, node 2 = {4}, devices node-major.
  const auto pl = weft::cuda::detail::place_ranks(5, std::nullopt, "", {7, 3, 7, 3, 5});
  EXPECT_EQ(pl.cluster->devices_per_node(), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(pl.devices, (std::vector<int>{0, 2, 1, 3, 4}));
  EXPECT_EQ(pl.node_of, (std::vector<int>{0, 1, 0, 1, 2}));
  expect_error(
      [] {
        (void)weft::cuda::detail::place_ranks(3, std::nullopt, nullptr, {0, 1});
      },
      {"options::node_of has 2 labels for a communicator of 3 ranks"});
}

TEST(nccl, an_emulated_topology_wins_and_must_match_the_size) {
  const auto topo = weft::topology::parse("2x2");
  auto pl = weft::cuda::detail::place_ranks(4, topo, "1+3", {0, 0, 0, 0});
  EXPECT_TRUE(pl.emulated);
  EXPECT_EQ(pl.node_of, (std::vector<int>{0, 0, 1, 1}));
  pl = weft::cuda::detail::place_ranks(4, std::nullopt, "1+3",
                                       {0, 0, 0, 0}); // the environment before labels
  EXPECT_EQ(pl.node_of, (std::vector<int>{0, 1, 1, 1}));
  expect_error([&] { (void)weft::cuda::detail::place_ranks(3, topo, nullptr, {}); },
               {"the topology in nccl::options describes 4 ranks", "the NCCL communicator has 3"});
  expect_error([] { (void)weft::cuda::detail::place_ranks(3, std::nullopt, "2x4", {}); },
               {"WEFT_TOPOLOGY=\"2x4\" describes 8 ranks"});
}

// The plan layout: which receives land straight in their destination, which in a temporary.
using weft::cuda::detail::device_plan_layout;
constexpr std::size_t direct = device_plan_layout::direct;

weft::plan plan_for(int size, int rank) {
  return weft::plan(weft::plan_request{collective::all_reduce, size, rank, 8, 0, {}, 4});
}

device_plan_layout lay_out(const weft::plan& pl, std::size_t in, std::size_t out,
                           bool in_place = false) {
  const std::size_t sizes[3] = {in, out, pl.scratch_count()};
  const std::size_t phase[3] = {0, 0, 0};
  device_plan_layout l;
  weft::cuda::detail::lay_out(pl, pl.rank(), pl.size(), sizes, 4, in_place, phase, "all_reduce", l);
  return l;
}

TEST(nccl, a_receive_lands_directly_unless_an_earlier_step_of_its_round_touches_it) {
  auto pl = plan_for(3, 0);
  pl.send(1, buffer::input, 0, 4);
  pl.recv(2, buffer::output, 0, 4); // 0: nothing before it touches output[0, 4)
  pl.next_round();
  pl.copy(buffer::input, 0, buffer::output, 0, 4);
  pl.recv(1, buffer::output, 2, 4); // 3: the copy wrote output[0, 4)
  pl.recv(2, buffer::output, 6, 2); // 4: disjoint from both
  pl.next_round();
  pl.recv(1, buffer::output, 0, 4);
  pl.recv(2, buffer::output, 3, 2); // 6: overlaps the receive before it
  pl.next_round();
  pl.recv_reduce(1, buffer::input, 0, buffer::output, 0, 8); // 7: always a temporary
  pl.recv_reduce(2, buffer::input, 0, buffer::scratch, 0, 1);
  pl.need_scratch(1);
  const auto l = lay_out(pl, 8, 8);
  const std::size_t a = device_plan_layout::alignment;
  // Each temporary at its destination's address mod 16: output[2] is 8 bytes in, output[3] 12.
  EXPECT_EQ(l.temp,
            (std::vector<std::size_t>{direct, direct, direct, 8, direct, direct, 12, 0, a}));
  EXPECT_EQ(l.scratch_bytes, a);
  EXPECT_EQ(l.temp_bytes, 2 * a); // the largest round: two temporaries
  EXPECT_EQ(l.bytes(), 3 * a);
}

TEST(nccl, in_place_input_and_output_are_one_buffer) {
  auto pl = plan_for(2, 1);
  pl.need_scratch(4);
  pl.copy(buffer::input, 2, buffer::scratch, 0, 4);
  pl.recv(0, buffer::output, 0, 4);
  EXPECT_EQ(lay_out(pl, 8, 8, false).temp[1], direct);
  EXPECT_EQ(lay_out(pl, 8, 8, true).temp[1], 0u);
}

TEST(nccl, plan_layout_refuses_bad_ranges_peers_and_peer_access_steps) {
  auto long_recv = plan_for(2, 0);
  long_recv.recv(1, buffer::output, 6, 4);
  expect_error([&] { (void)lay_out(long_recv, 8, 8); },
               {"all_reduce on rank 0", "plan step addresses elements [6, 10) of a buffer of 8"});
  auto short_input = plan_for(2, 0);
  short_input.send(1, buffer::input, 0, 8);
  expect_error([&] { (void)lay_out(short_input, 4, 8); }, {"elements [0, 8) of a buffer of 4"});
  auto to_self = plan_for(2, 1);
  to_self.send(1, buffer::input, 0, 2);
  expect_error([&] { (void)lay_out(to_self, 8, 8); },
               {"all_reduce on rank 1 (peer 1): peer outside the communicator of 2 ranks"});
  auto loads = plan_for(2, 0);
  loads.load(1, buffer::input, 0, buffer::output, 0, 8);
  expect_error([&] { (void)lay_out(loads, 8, 8); }, {"a load step, which needs peer access"});
  auto syncs = plan_for(2, 0);
  syncs.sync(syncs.add_group({0, 1}));
  expect_error([&] { (void)lay_out(syncs, 8, 8); }, {"a sync step"});
}

// Every receive-reduce of the reducing plans, for 2 to 8 ranks and counts that the ranks do not
// divide, reduces a temporary that agrees with its destination mod 16 (and, where input and
// output index alike, with its other source: so its kernel runs in 16-byte packs), and every
// temporary lies inside the round's temporaries, apart from the others of its round. Addresses
// are computed here from the layout's offsets: buffers at the phases a caller can pass (the
// output one element past a boundary, as a sub-span gives), the scratch at the start of the
// device scratch, the temporaries after it.
template <class Algo>
void check_receive_reduce_phases(collective coll, int p, std::size_t n, std::size_t es,
                                 std::size_t out_phase, bool operands_index_alike) {
  if (!Algo::serves(coll)) return;
  for (int r = 0; r < p; ++r) {
    const weft::plan pl = Algo::make_plan(weft::plan_request{coll, p, r, n, 0, {}, es});
    const std::size_t big = n * static_cast<std::size_t>(p);
    const std::size_t sizes[3] = {big, big, pl.scratch_count()};
    const std::size_t phase[3] = {0, out_phase, 0};
    device_plan_layout l;
    weft::cuda::detail::lay_out(pl, r, p, sizes, es, false, phase, "all_reduce", l);
    const std::uintptr_t scratch_at = 0x7000000;
    const std::uintptr_t at[3] = {0x1000000, 0x3000000 + out_phase, scratch_at};
    const std::uintptr_t temps_at = scratch_at + l.scratch_bytes;
    const auto& steps = pl.steps();
    for (const weft::plan_round& round : weft::rounds_of(steps)) {
      std::vector<std::pair<std::size_t, std::size_t>> taken;
      for (std::size_t k = round.begin; k < round.end; ++k) {
        const weft::step& st = steps[k];
        if (l.temp[k] == direct) continue;
        const std::size_t bytes = st.count * es;
        EXPECT_LE(l.temp[k] + bytes, l.temp_bytes);
        for (const auto& [b, e] : taken)
          EXPECT_TRUE(l.temp[k] >= e || l.temp[k] + bytes <= b) << "temporaries overlap";
        taken.emplace_back(l.temp[k], l.temp[k] + bytes);
        const std::uintptr_t dst = at[static_cast<int>(st.dst)] + st.dst_offset * es;
        const std::uintptr_t temp = temps_at + l.temp[k];
        EXPECT_EQ(temp % 16, dst % 16)
            << Algo::name << " " << weft::name_of(coll) << " p=" << p << " rank " << r << " n=" << n
            << " element " << es << " step " << k;
        // Where the plan reduces a block into the same offset of its destination, the plan's
        // own operands agree too.
        if (st.kind == weft::step_kind::recv_reduce && out_phase == 0 && operands_index_alike) {
          const std::uintptr_t src = at[static_cast<int>(st.src)] + st.src_offset * es;
          EXPECT_EQ(src % 16, dst % 16)
              << Algo::name << " " << weft::name_of(coll) << " p=" << p << " rank " << r
              << " n=" << n << " element " << es << " step " << k << ": the plan's own operands";
        }
      }
    }
  }
}

TEST(nccl, every_receive_reduce_has_its_operands_on_one_phase_mod_16) {
  for (int p = 2; p <= 8; ++p) {
    for (std::size_t n : {std::size_t{37}, std::size_t{1001}, std::size_t{10000} + 3}) {
      if (n % static_cast<std::size_t>(p) == 0) continue;
      for (std::size_t es : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        for (std::size_t out_phase : {std::size_t{0}, es}) {
          // reduce_scatter's last step reads input block r into output[0]: there only the
          // temporary's phase is the layout's to choose.
          for (collective coll :
               {collective::all_reduce, collective::reduce_scatter, collective::reduce}) {
            check_receive_reduce_phases<algo::ring>(coll, p, n, es, out_phase,
                                                    coll != collective::reduce_scatter);
            check_receive_reduce_phases<algo::tree>(coll, p, n, es, out_phase, true);
          }
          check_receive_reduce_phases<algo::halving_doubling>(collective::all_reduce, p, n, es,
                                                              out_phase, true);
          check_receive_reduce_phases<algo::recursive_doubling>(collective::all_reduce, p, n, es,
                                                                out_phase, true);
          check_receive_reduce_phases<algo::hierarchical<algo::ring, algo::ring>>(
              collective::all_reduce, p, n, es, out_phase, true);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Device helpers

nccl::options test_options(std::optional<weft::topology::cluster> topo = std::nullopt) {
  nccl::options o;
  o.timeout = std::chrono::seconds(60); // a broken plan fails the test instead of stalling it
  o.topology = std::move(topo);
  return o;
}

communicator single_rank(const nccl::options& opt = test_options()) {
  auto all = communicator::init_all({0}, opt);
  return std::move(all.front());
}

template <class T>
void upload(communicator& c, const device_buffer<T>& d, const std::vector<T>& h) {
  if (h.empty()) return;
  WEFT_CUDA_TRY(cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice,
                                c.stream()));
}

template <class T>
std::vector<T> download(communicator& c, const device_buffer<T>& d, std::size_t n) {
  c.synchronize(); // with a deadline: a hung collective fails here, not in cudaMemcpy
  std::vector<T> h(n);
  if (n != 0) {
    WEFT_CUDA_TRY(
        cudaMemcpyAsync(h.data(), d.data(), n * sizeof(T), cudaMemcpyDeviceToHost, c.stream()));
  }
  c.synchronize();
  return h;
}

// One call of collective C with policy Algo on this rank's device buffers, checked against
// the reference of every rank's inputs.
template <class Algo, collective C, class T, class Op>
void check_collective(communicator& c, std::size_t count, int root, pattern pat, bool in_place) {
  using weft::test::input_count;
  using weft::test::output_count;
  const int p = c.size();
  const int r = c.rank();
  std::vector<std::vector<T>> inputs(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    for (std::size_t i = 0; i < input_count(C, p, count); ++i) {
      inputs[static_cast<std::size_t>(s)].push_back(weft::test::input_value<T, Op>(s, i, pat));
    }
  }
  const auto want =
      weft::test::reference<T, Op>(C, p, count, root, inputs)[static_cast<std::size_t>(r)];
  const std::vector<T>& mine = inputs[static_cast<std::size_t>(r)];
  std::vector<T> out(output_count(C, p, count, r, root), T{});
  if (C == collective::broadcast && r == root) out = mine;
  device_buffer<T> d_in(mine.size());
  device_buffer<T> d_out(out.size());
  upload(c, d_in, mine);
  upload(c, d_out, out);
  const std::span<const T> in_span(d_in.data(), mine.size());
  const std::span<T> out_span(d_out.data(), out.size());
  const device_buffer<T>* result = &d_out;
  if constexpr (C == collective::all_reduce) {
    if (in_place) {
      weft::all_reduce<Algo>(c, std::span<T>(d_in.data(), mine.size()), Op{});
      result = &d_in;
    } else {
      weft::all_reduce<Algo>(c, in_span, out_span, Op{});
    }
  } else if constexpr (C == collective::reduce_scatter) {
    weft::reduce_scatter<Algo>(c, in_span, out_span, Op{});
  } else if constexpr (C == collective::all_gather) {
    weft::all_gather<Algo>(c, in_span, out_span);
  } else if constexpr (C == collective::broadcast) {
    weft::broadcast<Algo>(c, out_span, root);
  } else if constexpr (C == collective::reduce) {
    weft::reduce<Algo>(c, in_span, out_span, root, Op{});
  } else {
    weft::all_to_all<Algo>(c, in_span, out_span);
  }
  const auto got = download(c, *result, want.size());
  const bool exact = pat == pattern::exact || std::is_integral_v<T>;
  const std::string diff = weft::test::compare(got, want, exact, weft::test::tolerance<T>(p));
  EXPECT_TRUE(diff.empty()) << weft::name_of(C) << "<" << Algo::name << "> "
                            << weft::dtype_traits<T>::name << " " << weft::op_name<Op>()
                            << " p=" << p << " rank " << r << " count " << count << " root " << root
                            << (in_place ? " in place" : "") << ": " << diff;
}

template <class... A>
struct type_list {};

using algorithms = type_list<algo::ring, algo::tree, algo::halving_doubling,
                             algo::recursive_doubling, algo::hierarchical<algo::ring, algo::ring>,
                             algo::automatic, algo::pairwise, algo::vendor>;

// The cases of the brief: float sum, int32 sum and max, half sum, double avg (reductions);
// float, int32 and half for the collectives that only move data.
template <class Algo, collective C>
void check_cases(communicator& c, const std::vector<std::size_t>& counts) {
  if constexpr (Algo::serves(C)) {
    constexpr bool reduces =
        C == collective::all_reduce || C == collective::reduce_scatter || C == collective::reduce;
    const int p = c.size();
    std::vector<int> roots{p - 1};
    if ((C == collective::broadcast || C == collective::reduce) && p > 1) roots.push_back(0);
    for (std::size_t count : counts) {
      for (int root : roots) {
        check_collective<Algo, C, float, op::sum>(c, count, root, pattern::exact, false);
        check_collective<Algo, C, std::int32_t, op::sum>(c, count, root, pattern::exact, false);
        check_collective<Algo, C, weft::half, op::sum>(c, count, root, pattern::exact, false);
        if constexpr (reduces) {
          check_collective<Algo, C, std::int32_t, op::max>(c, count, root, pattern::random, false);
          check_collective<Algo, C, double, op::avg>(c, count, root, pattern::random, false);
        }
        if constexpr (C == collective::all_reduce) {
          check_collective<Algo, C, float, op::sum>(c, count, root, pattern::random, true);
          check_collective<Algo, C, std::int32_t, op::avg>(c, count, root, pattern::exact, true);
        }
      }
    }
  }
}

template <class Algo>
void check_algorithm(communicator& c, const std::vector<std::size_t>& counts) {
  check_cases<Algo, collective::all_reduce>(c, counts);
  check_cases<Algo, collective::reduce_scatter>(c, counts);
  check_cases<Algo, collective::all_gather>(c, counts);
  check_cases<Algo, collective::broadcast>(c, counts);
  check_cases<Algo, collective::reduce>(c, counts);
  check_cases<Algo, collective::all_to_all>(c, counts);
}

template <class... A>
void check_every_algorithm(communicator& c, const std::vector<std::size_t>& counts,
                           type_list<A...>) {
  (check_algorithm<A>(c, counts), ...);
}

// ---------------------------------------------------------------------------------------
// One device: size-1 communicators

TEST(nccl, single_rank_every_collective_and_algorithm_matches_the_reference) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.cuda_device(), 0);
  check_every_algorithm(c, {0, 1, 5, 3001}, algorithms{});
}

TEST(nccl, a_borrowed_comm_and_stream_keep_working_after_weft_is_done) {
  WEFT_REQUIRE_DEVICE();
  WEFT_CUDA_TRY(cudaSetDevice(0));
  ncclComm_t user_comm = nullptr;
  const int dev = 0;
  WEFT_NCCL_TRY(ncclCommInitAll(&user_comm, 1, &dev));
  cudaStream_t user_stream = nullptr;
  WEFT_CUDA_TRY(cudaStreamCreate(&user_stream));
  {
    auto c = communicator::borrow(user_comm, user_stream, test_options());
    EXPECT_FALSE(c.owns_comm());
    EXPECT_FALSE(c.owns_stream());
    EXPECT_EQ(c.native(), user_comm);
    EXPECT_EQ(c.stream(), user_stream);
    check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, 1000, 0,
                                                                         pattern::random, false);
    check_collective<algo::vendor, collective::all_reduce, float, op::sum>(c, 1000, 0,
                                                                           pattern::random, false);
    c.barrier();
  }
  // weft destroyed neither: the program's own NCCL call on its own stream still works.
  device_buffer<float> d(4);
  const std::vector<float> h{1, 2, 3, 4};
  WEFT_CUDA_TRY(
      cudaMemcpyAsync(d.data(), h.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, user_stream));
  WEFT_NCCL_TRY(ncclAllReduce(d.data(), d.data(), 4, ncclFloat32, ncclSum, user_comm, user_stream));
  std::vector<float> back(4);
  WEFT_CUDA_TRY(cudaMemcpyAsync(back.data(), d.data(), 4 * sizeof(float), cudaMemcpyDeviceToHost,
                                user_stream));
  WEFT_CUDA_TRY(cudaStreamSynchronize(user_stream));
  EXPECT_EQ(back, h);
  WEFT_NCCL_TRY(ncclCommDestroy(user_comm));
  WEFT_CUDA_TRY(cudaStreamDestroy(user_stream));
}

TEST(nccl, owning_communicators_from_a_unique_id_and_from_init_all) {
  WEFT_REQUIRE_DEVICE();
  WEFT_CUDA_TRY(cudaSetDevice(0));
  ncclUniqueId id{};
  WEFT_NCCL_TRY(ncclGetUniqueId(&id));
  auto c = communicator::init_rank(id, 0, 1, nullptr, test_options());
  EXPECT_TRUE(c.owns_comm());
  EXPECT_TRUE(c.owns_stream());
  check_collective<algo::automatic, collective::all_gather, std::int32_t, op::sum>(
      c, 77, 0, pattern::exact, false);
  communicator moved = std::move(c); // the moved-to object owns, the moved-from one holds nothing
  check_collective<algo::vendor, collective::reduce, double, op::avg>(moved, 77, 0, pattern::random,
                                                                      false);
  auto d = single_rank();
  EXPECT_TRUE(d.owns_comm());
  d = std::move(moved); // assignment releases d's own communicator first
  EXPECT_EQ(d.size(), 1);
  check_collective<algo::ring, collective::broadcast, weft::half, op::sum>(d, 77, 0, pattern::exact,
                                                                           false);
  d = single_rank(); // d's communicator, moved in from c, goes by assignment too
  check_collective<algo::ring, collective::all_reduce, float, op::sum>(d, 77, 0, pattern::random,
                                                                       false);
  d.abort_on_destroy(); // then aborted (ncclCommAbort), not destroyed, when d goes
}

TEST(nccl, split_shares_the_stream_and_runs_collectives) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  auto child = c.split(3, 7);
  EXPECT_EQ(child.size(), 1);
  EXPECT_EQ(child.rank(), 0);
  EXPECT_EQ(child.stream(), c.stream());
  EXPECT_TRUE(child.owns_comm());
  check_collective<algo::ring, collective::all_reduce, float, op::sum>(child, 300, 0,
                                                                       pattern::exact, false);
  check_collective<algo::vendor, collective::all_reduce, std::int32_t, op::avg>(
      child, 300, 0, pattern::exact, true);
  expect_error([&] { (void)c.split(-1, 0); }, {"color must be >= 0"});
}

TEST(nccl, an_all_reduce_captured_into_a_cuda_graph_replays) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  constexpr std::size_t n = 4096;
  device_buffer<float> in(n);
  device_buffer<float> out(n);
  const auto run = [&] {
    weft::all_reduce<algo::ring>(c, std::span<const float>(in.data(), n), std::span(out.data(), n));
    weft::all_reduce<algo::vendor>(c, std::span(out.data(), n),
                                   op::avg{}); // NCCL's kernels, captured too
  };
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i)
    h[i] = static_cast<float>(i % 97);
  upload(c, in, h);
  run(); // before the capture: plans built, scratch grown
  EXPECT_EQ(download(c, out, n), h);
  cudaGraph_t graph = nullptr;
  WEFT_CUDA_TRY(cudaStreamBeginCapture(c.stream(), cudaStreamCaptureModeGlobal));
  run();
  WEFT_CUDA_TRY(cudaStreamEndCapture(c.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  WEFT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 1; replay <= 2; ++replay) {
    for (auto& v : h)
      v += 1.0f;
    upload(c, in, h);
    WEFT_CUDA_TRY(cudaGraphLaunch(exec, c.stream()));
    EXPECT_EQ(download(c, out, n), h) << "replay " << replay;
  }
  WEFT_CUDA_TRY(cudaGraphExecDestroy(exec));
  WEFT_CUDA_TRY(cudaGraphDestroy(graph));
}

// A graph captured a call through the scratch; a later, larger call outside the capture grows
// the scratch. The block the graph points into is kept (not freed), so the graph's replays still
// give the right result; release_graph_scratch() frees it once the graph is gone.
TEST(nccl, a_graph_keeps_its_scratch_when_a_later_call_grows_it) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  const auto through_scratch = [](std::size_t n) {
    weft::plan pl(weft::plan_request{collective::all_reduce, 1, 0, n, 0, {}, 4});
    pl.need_scratch(n);
    pl.copy(buffer::input, 0, buffer::scratch, 0, n);
    pl.copy(buffer::scratch, 0, buffer::output, 0, n);
    return pl;
  };
  constexpr std::size_t n = 4096;
  constexpr std::size_t big = std::size_t{1} << 22;
  const auto small_plan = through_scratch(n);
  const auto big_plan = through_scratch(big);
  device_buffer<float> in(big);
  device_buffer<float> out(big);
  c.reserve(n * sizeof(float));
  cudaGraph_t graph = nullptr;
  WEFT_CUDA_TRY(cudaStreamBeginCapture(c.stream(), cudaStreamCaptureModeGlobal));
  c.execute(small_plan, in.data(), n, out.data(), n, op::sum{}, "all_reduce");
  WEFT_CUDA_TRY(cudaStreamEndCapture(c.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  WEFT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(c.graph_scratch_bytes(), 0u);
  c.execute(big_plan, in.data(), big, out.data(), big, op::sum{}, "all_reduce"); // grows
  EXPECT_GE(c.graph_scratch_bytes(), n * sizeof(float));
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i)
    h[i] = static_cast<float>(i % 89) + 0.5f;
  upload(c, in, h);
  WEFT_CUDA_TRY(cudaGraphLaunch(exec, c.stream()));
  EXPECT_EQ(download(c, out, n), h);
  WEFT_CUDA_TRY(cudaGraphExecDestroy(exec));
  WEFT_CUDA_TRY(cudaGraphDestroy(graph));
  c.release_graph_scratch();
  EXPECT_EQ(c.graph_scratch_bytes(), 0u);
  check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, 300, 0, pattern::exact,
                                                                       false);
}

TEST(nccl, bad_buffers_and_plans_are_errors_before_anything_is_queued) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  device_buffer<float> in(8);
  device_buffer<float> out(8);
  const auto ring8 =
      algo::ring::make_plan(weft::plan_request{collective::all_reduce, 1, 0, 8, 0, {}, 4});
  expect_error([&] { c.execute(ring8, in.data(), 4, out.data(), 8, op::sum{}, "all_reduce"); },
               {"all_reduce on rank 0", "of a buffer of 4"});
  const auto other =
      algo::ring::make_plan(weft::plan_request{collective::all_reduce, 2, 1, 8, 0, {}, 4});
  expect_error([&] { c.execute(other, in.data(), 8, out.data(), 8, op::sum{}, "all_reduce"); },
               {"the plan is for rank 1 of 2, not rank 0 of 1"});
  weft::plan loads(weft::plan_request{collective::all_reduce, 1, 0, 8, 0, {}, 4});
  loads.sync(loads.add_group({0}));
  loads.load(0, buffer::input, 0, buffer::output, 0, 8);
  expect_error([&] { c.execute(loads, in.data(), 8, out.data(), 8, op::sum{}, "all_reduce"); },
               {"loads from peers' buffers", "NCCL ranks cannot"});
  expect_error(
      [&] { c.vendor<collective::all_gather>(in.data(), 8, out.data(), 4, 8, 0, op::sum{}); },
      {"vendor all_gather of 8 on 1 ranks needs an input of 8 elements and an output of 8, not 8 "
       "and 4"});
  std::vector<float> host(8, 1.0f);
  expect_error([&] { weft::all_reduce<algo::ring>(c, std::span(host)); },
               {"all_reduce on rank 0", "the input is host memory"});
  expect_error([&] { weft::all_reduce<algo::vendor>(c, std::span(host)); }, {"host memory"});
  c.synchronize(); // nothing was queued by the failed calls, and the communicator still works
  check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, 8, 0, pattern::exact,
                                                                       false);
}

TEST(nccl, capture_refuses_to_grow_the_scratch_and_to_block) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();
  constexpr std::size_t n = 1 << 20;
  device_buffer<float> in(n);
  device_buffer<float> out(n);
  weft::plan through_scratch(weft::plan_request{collective::all_reduce, 1, 0, n, 0, {}, 4});
  through_scratch.need_scratch(n);
  through_scratch.copy(buffer::input, 0, buffer::scratch, 0, n);
  through_scratch.copy(buffer::scratch, 0, buffer::output, 0, n);
  WEFT_CUDA_TRY(cudaStreamBeginCapture(c.stream(), cudaStreamCaptureModeGlobal));
  expect_error(
      [&] { c.execute(through_scratch, in.data(), n, out.data(), n, op::sum{}, "all_reduce"); },
      {"being captured into a CUDA graph", "reserve()"});
  expect_error([&] { c.barrier(); },
               {"barrier on rank 0", "cannot run while the stream is being captured"});
  cudaGraph_t graph = nullptr;
  WEFT_CUDA_TRY(cudaStreamEndCapture(c.stream(), &graph));
  WEFT_CUDA_TRY(cudaGraphDestroy(graph));
  c.reserve(n * sizeof(float)); // after reserving, the same plan captures
  WEFT_CUDA_TRY(cudaStreamBeginCapture(c.stream(), cudaStreamCaptureModeGlobal));
  c.execute(through_scratch, in.data(), n, out.data(), n, op::sum{}, "all_reduce");
  WEFT_CUDA_TRY(cudaStreamEndCapture(c.stream(), &graph));
  WEFT_CUDA_TRY(cudaGraphDestroy(graph));
}

// Keeps the stream busy for `ns` nanoseconds of the device's clock: work that outlasts a
// deadline without any peer.
__global__ void busy_for(std::uint64_t ns) {
  const auto now = [] {
    std::uint64_t t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const std::uint64_t start = now();
  while (now() - start < ns)
    __nanosleep(1000);
}

TEST(nccl, a_wait_past_the_deadline_aborts_and_every_later_call_throws_the_first_error_at_once) {
  WEFT_REQUIRE_DEVICE();
  auto c = single_rank();     // made with a long deadline: NCCL's initialization may take a while
  auto child = c.split(0, 0); // one family: the split fails with its parent
  c.set_timeout(std::chrono::milliseconds(300));
  device_buffer<float> d(16);
  busy_for<<<1, 1, 0, c.stream()>>>(2'000'000'000); // 2 s: past the deadline
  WEFT_CUDA_TRY(cudaGetLastError());
  std::string first;
  try {
    c.synchronize();
    ADD_FAILURE() << "no weft::error thrown";
  } catch (const weft::error& e) {
    first = e.what();
  }
  EXPECT_NE(first.find("synchronize on rank 0: timed out after 300 ms"), std::string::npos)
      << first;
  EXPECT_NE(first.find("the NCCL communicator is aborted"), std::string::npos) << first;
  EXPECT_TRUE(c.failed());
  EXPECT_TRUE(child.failed());
  EXPECT_EQ(c.failure(), first);
  const auto t = std::chrono::steady_clock::now();
  expect_error([&] { c.barrier(); }, {"barrier on rank 0", "failed earlier", first});
  expect_error([&] { weft::all_reduce<algo::ring>(c, std::span(d.data(), 16)); },
               {"all_reduce on rank 0", first});
  expect_error([&] { weft::all_reduce<algo::vendor>(child, std::span(d.data(), 16)); },
               {"all_reduce on rank 0", first});
  expect_error([&] { (void)c.split(0, 0); }, {"split on rank 0", first});
  expect_error([&] { c.check_async_error("work"); }, {"work on rank 0", first});
  EXPECT_LT(std::chrono::steady_clock::now() - t, std::chrono::milliseconds(100)) << "not at once";
  WEFT_CUDA_TRY(cudaStreamSynchronize(c.stream())); // the busy kernel, not NCCL's
}

TEST(nccl, destroying_waits_at_most_the_deadline) {
  WEFT_REQUIRE_DEVICE();
  std::chrono::steady_clock::duration took{};
  {
    auto c = single_rank();
    c.set_timeout(std::chrono::milliseconds(300));
    check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, 100, 0, pattern::exact,
                                                                         false);
    busy_for<<<1, 1, 0, c.stream()>>>(3'000'000'000); // 3 s of work the destructor would wait for
    WEFT_CUDA_TRY(cudaGetLastError());
    const auto t = std::chrono::steady_clock::now();
    { communicator gone = std::move(c); } // drains at most 300 ms, then aborts
    took = std::chrono::steady_clock::now() - t;
  }
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  {
    auto healthy = single_rank(); // finalized and destroyed, quickly
    healthy.set_timeout(std::chrono::milliseconds(300));
    check_collective<algo::vendor, collective::all_reduce, float, op::sum>(healthy, 100, 0,
                                                                           pattern::exact, false);
  }
  WEFT_CUDA_TRY(cudaDeviceSynchronize()); // the busy kernel, before the next test
}

TEST(nccl, on_failure_is_an_option_and_throws_by_default) {
  static_assert(std::is_same_v<decltype(nccl::options{}.on_failure), weft::on_failure>);
  EXPECT_EQ(nccl::options{}.on_failure, weft::on_failure::throw_error);
  EXPECT_EQ(nccl::options{}.end_job, nullptr);
}

// ---------------------------------------------------------------------------------------
// Several devices: one host thread per rank

// Runs f on every rank of a new communicator over devices 0 .. p-1, each rank in a thread
// of its own with its device current; reports each rank's exception as a failure.
template <class F>
void on_ranks(int p, const nccl::options& opt, F&& f) {
  std::vector<int> devices(static_cast<std::size_t>(p));
  std::iota(devices.begin(), devices.end(), 0);
  auto comms = communicator::init_all(devices, opt);
  std::vector<std::string> failures(static_cast<std::size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        WEFT_CUDA_TRY(cudaSetDevice(devices[static_cast<std::size_t>(r)]));
        f(comms[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < p; ++r) {
    EXPECT_TRUE(failures[static_cast<std::size_t>(r)].empty())
        << "rank " << r << ": " << failures[static_cast<std::size_t>(r)];
  }
}

// The number of ranks the multi-rank tests use; skips the test when below two.
#define WEFT_REQUIRE_DEVICES(var)                                                                  \
  WEFT_REQUIRE_DEVICE();                                                                           \
  const int var = std::min(4, weft::cuda::device_count());                                         \
  if (var < 2) {                                                                                   \
    GTEST_SKIP()                                                                                   \
        << "a multi-rank NCCL communicator needs two CUDA devices or more (one rank per device); " \
           "this machine has "                                                                     \
        << var;                                                                                    \
  }

// Two emulated nodes over p ranks: hierarchical<> then has traffic within and across nodes.
weft::topology::cluster two_nodes(int p) {
  return weft::topology::parse(std::to_string(p / 2) + "+" + std::to_string(p - p / 2));
}

TEST(nccl, multi_rank_every_collective_and_algorithm_matches_the_reference) {
  WEFT_REQUIRE_DEVICES(devices);
  for (int p = 2; p <= devices; ++p) {
    const std::vector<std::size_t> counts{0, 1, static_cast<std::size_t>(p) - 1,
                                          static_cast<std::size_t>(p) + 3, 3001};
    on_ranks(p, test_options(),
             [&](communicator& c) { check_every_algorithm(c, counts, algorithms{}); });
  }
}

TEST(nccl, multi_rank_hierarchical_and_automatic_across_emulated_nodes) {
  WEFT_REQUIRE_DEVICES(devices);
  for (int p = 2; p <= devices; ++p) {
    on_ranks(p, test_options(two_nodes(p)), [&](communicator& c) {
      EXPECT_EQ(c.cluster().nodes(), 2);
      const std::vector<std::size_t> counts{1, static_cast<std::size_t>(p) + 3, 3001};
      check_algorithm<algo::hierarchical<algo::ring, algo::ring>>(c, counts);
      check_algorithm<algo::hierarchical<algo::ring, algo::tree>>(c, counts);
      check_algorithm<algo::automatic>(c, counts);
    });
  }
}

TEST(nccl, multi_rank_large_messages_cut_into_chunks) {
  WEFT_REQUIRE_DEVICES(devices);
  constexpr std::size_t n = 600'001; // 2.4 MB of floats: several ring and tree chunks
  on_ranks(devices, test_options(), [&](communicator& c) {
    check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, n, 0, pattern::random,
                                                                         false);
    check_collective<algo::tree, collective::all_reduce, float, op::sum>(c, n, 0, pattern::random,
                                                                         true);
    check_collective<algo::halving_doubling, collective::all_reduce, float, op::sum>(
        c, n, 0, pattern::random, false);
    check_collective<algo::ring, collective::all_gather, std::int32_t, op::sum>(
        c, n, 0, pattern::exact, false);
    check_collective<algo::ring, collective::broadcast, std::int32_t, op::sum>(
        c, n, 1, pattern::exact, false);
    check_collective<algo::vendor, collective::all_reduce, float, op::sum>(c, n, 0, pattern::random,
                                                                           false);
  });
}

TEST(nccl, multi_rank_barrier_split_and_point_to_point) {
  WEFT_REQUIRE_DEVICES(devices);
  const int p = devices;
  on_ranks(p, test_options(), [&](communicator& c) {
    const int r = c.rank();
    c.barrier();
    // Parity groups, each ordered by descending parent rank.
    auto group = c.split(r % 2, -r);
    const int members = (p - r % 2 + 1) / 2;
    EXPECT_EQ(group.size(), members);
    EXPECT_EQ(group.rank(), (p - 1 - r) / 2); // the same-parity ranks above r come first
    EXPECT_EQ(group.stream(), c.stream());
    EXPECT_EQ(group.cuda_device(), c.cuda_device());
    check_collective<algo::ring, collective::all_reduce, std::int32_t, op::sum>(
        group, 7, 0, pattern::exact, false);
    // A ring of sendrecv, then plain send/recv between ranks 0 and 1.
    const std::vector<std::int64_t> mine{r, 10 * r, 7};
    std::vector<std::int64_t> left(3);
    c.sendrecv(std::span<const std::int64_t>(mine), (r + 1) % p, std::span(left), (r + p - 1) % p,
               9);
    const std::int64_t l = (r + p - 1) % p;
    EXPECT_EQ(left, (std::vector<std::int64_t>{l, 10 * l, 7}));
    std::vector<weft::half> h(5);
    if (r == 0) {
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = weft::half(static_cast<float>(i) + 0.5f);
      c.send(std::span<const weft::half>(h), 1, 3);
    } else if (r == 1) {
      c.recv(std::span(h), 0, 3);
      for (std::size_t i = 0; i < h.size(); ++i)
        EXPECT_EQ(static_cast<float>(h[i]), static_cast<float>(i) + 0.5f);
    }
    c.barrier();
  });
}

TEST(nccl, multi_rank_graph_capture_of_a_plan_and_of_vendor) {
  WEFT_REQUIRE_DEVICES(devices);
  on_ranks(devices, test_options(), [&](communicator& c) {
    const int p = c.size();
    constexpr std::size_t n = 10'000;
    device_buffer<std::int32_t> buf(n);
    std::vector<std::int32_t> h(n);
    const auto fill = [&](int round) {
      for (std::size_t i = 0; i < n; ++i)
        h[i] = static_cast<std::int32_t>((c.rank() + 1) * round + static_cast<int>(i % 13));
      upload(c, buf, h);
    };
    // Sum over ranks of (rank + 1) * round + i % 13, then the vendor all-reduce's max leaves it.
    const auto expect_sum = [&](int round) {
      const auto got = download(c, buf, n);
      for (std::size_t i = 0; i < n; i += 997) {
        EXPECT_EQ(got[i], p * (p + 1) / 2 * round + p * static_cast<int>(i % 13))
            << "element " << i;
      }
    };
    const auto run = [&] {
      weft::all_reduce<algo::ring>(c, std::span(buf.data(), n));
      weft::all_reduce<algo::vendor>(c, std::span(buf.data(), n), op::max{});
    };
    fill(1);
    run(); // builds the plans and grows the scratch before the capture
    expect_sum(1);
    c.barrier();
    cudaGraph_t graph = nullptr;
    // Thread-local: the other ranks' threads go on making calls of their own meanwhile.
    WEFT_CUDA_TRY(cudaStreamBeginCapture(c.stream(), cudaStreamCaptureModeThreadLocal));
    run();
    WEFT_CUDA_TRY(cudaStreamEndCapture(c.stream(), &graph));
    cudaGraphExec_t exec = nullptr;
    WEFT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 2; round <= 3; ++round) {
      fill(round);
      WEFT_CUDA_TRY(cudaGraphLaunch(exec, c.stream()));
      expect_sum(round);
    }
    WEFT_CUDA_TRY(cudaGraphExecDestroy(exec));
    WEFT_CUDA_TRY(cudaGraphDestroy(graph));
  });
}

TEST(nccl, multi_rank_check_calls_finds_ranks_that_disagree) {
  WEFT_REQUIRE_DEVICES(devices);
  weft::check_calls(true);
  std::vector<std::string> errors(static_cast<std::size_t>(devices));
  on_ranks(devices, test_options(), [&](communicator& c) {
    check_collective<algo::ring, collective::all_reduce, float, op::sum>(c, 100, 0, pattern::exact,
                                                                         false);
    check_collective<algo::vendor, collective::reduce, float, op::sum>(c, 100, 1, pattern::exact,
                                                                       false);
    device_buffer<float> d(101);
    try {
      weft::all_reduce<algo::ring>(c, std::span(d.data(), c.rank() == 1 ? 101 : 100));
    } catch (const weft::error& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  weft::check_calls(false);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the ranks called different collectives"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1 differs from rank 0 in count"), std::string::npos) << e;
  }
}

TEST(nccl, multi_rank_a_receive_that_expects_another_message_is_an_error) {
  WEFT_REQUIRE_DEVICES(devices);
  nccl::options opt = test_options();
  opt.timeout = std::chrono::seconds(3);
  // Two ranks whose exchange is broken on purpose: both are aborted, not destroyed, at the end,
  // so that neither waits for the other.
  std::vector<std::string> errors(2);
  on_ranks(2, opt, [&](communicator& c) {
    try {
      std::vector<std::int32_t> v(4);
      if (c.rank() == 0) c.send(std::span<const std::int32_t>(v.data(), 3), 1, 5);
      if (c.rank() == 1) c.recv(std::span(v), 0, 5);
    } catch (const weft::error& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
    c.abort_on_destroy();
  });
  EXPECT_NE(
      errors[1].find(
          "recv on rank 1 (peer 0): expected 4 x int32 tag 5 but the peer sent 3 x int32 tag 5"),
      std::string::npos)
      << errors[1];
  // The sender's data is never received. NCCL may still complete a send this small (its LL
  // protocol sends eagerly into the receiver's buffer); where it does not, the sender's wait
  // ends at the deadline, naming the peer, or earlier with NCCL's asynchronous error once the
  // receiver has aborted its communicator. The mismatch is detected on the receiving side.
  EXPECT_TRUE(
      errors[0].empty() ||
      errors[0].find("send on rank 0 (peer 1): timed out after 3000 ms waiting to send to it") !=
          std::string::npos ||
      errors[0].find("send on rank 0 (peer 1): an NCCL operation (asynchronous error") !=
          std::string::npos)
      << errors[0];
}

TEST(nccl, multi_rank_a_rank_that_never_joins_fails_the_others_call_and_every_later_one) {
  WEFT_REQUIRE_DEVICES(devices);
  (void)devices;
  std::string first;
  std::string later;
  std::chrono::steady_clock::duration later_took{};
  const auto start = std::chrono::steady_clock::now();
  on_ranks(2, test_options(), [&](communicator& c) {
    c.set_timeout(std::chrono::milliseconds(500)); // after NCCL's initialization, on both ranks
    if (c.rank() == 1) return;                     // never joins
    try {
      c.barrier();
    } catch (const weft::error& e) {
      first = e.what();
    }
    const auto t = std::chrono::steady_clock::now();
    try {
      c.barrier();
    } catch (const weft::error& e) {
      later = e.what();
    }
    later_took = std::chrono::steady_clock::now() - t;
  });
  // Both communicators are gone too: the aborted one at once, the other finalized or aborted
  // within its deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(first.find("barrier on rank 0"), std::string::npos) << first;
  EXPECT_NE(first.find("timed out after 500 ms"), std::string::npos) << first;
  EXPECT_NE(first.find("the NCCL communicator is aborted"), std::string::npos) << first;
  EXPECT_NE(later.find("barrier on rank 0"), std::string::npos) << later;
  EXPECT_NE(later.find(first), std::string::npos) << later;
  EXPECT_LT(later_took, std::chrono::milliseconds(100));
}

} // namespace
