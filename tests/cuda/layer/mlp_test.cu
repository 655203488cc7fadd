// The tensor-parallel MLP on the device path: parallel_mlp with weft::layer::cublas on each
// emulated rank's stream, so its weights, activations, GELU, bias and column sums live and run on
// the GPU and its collectives are the emulated transport's. TP 1..4 with an ffn size that divides
// by neither 3 nor 4, with and without sequence parallelism, float and double, against the unsplit
// MLP written out in double on the host (the same reference as tests/layer/mlp_test.cpp): output,
// input gradient, every parameter gradient, and the collectives traced (one all-reduce each way;
// with sequence parallelism an all-gather and a reduce-scatter each way). Skipped, with the
// reason, where there is no GPU.
#include <weft/comm/traced.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/embedding.hpp>
#include <weft/layer/mlp.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/mlp_reference.hpp"
#include "support/cuda.cuh"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
namespace emulated = weft::cuda::emulated;
using tl::dmat;
using weft::collective;

constexpr std::size_t tokens = 12, hidden = 6, ffn = 10;
constexpr std::uint64_t seed = 3, id = 20;

/// The host values of a device view (any ld), after the stream's work.
template <class T>
weft::matrix<T> download(weft::matrix_view<T> d, cudaStream_t s) {
  weft::matrix<T> h(d.rows(), d.cols());
  if (h.size() != 0) {
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(h.data(), d.cols() * sizeof(T), d.data(), d.ld() * sizeof(T),
                                    d.cols() * sizeof(T), d.rows(), cudaMemcpyDeviceToHost, s));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  return h;
}
/// A device view (any ld) = the host block of a double matrix, rounded to T.
template <class T>
void upload(const dmat& src, std::size_t r0, std::size_t c0, weft::matrix_view<T> d,
            cudaStream_t s) {
  const weft::matrix<T> h = tl::to<T>(tl::block(src, r0, d.rows(), c0, d.cols()));
  if (h.size() != 0) {
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(d.data(), d.ld() * sizeof(T), h.data(), d.cols() * sizeof(T),
                                    d.cols() * sizeof(T), d.rows(), cudaMemcpyHostToDevice, s));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
}

template <class C>
class device_mlp : public ::testing::Test {};
template <class T, class SP>
struct config {
  using type = T;
  using sp = SP;
};
using configs =
    ::testing::Types<config<float, wl::no_sequence_parallel>,
                     config<double, wl::no_sequence_parallel>, config<float, wl::sequence_parallel>,
                     config<double, wl::sequence_parallel>>;
TYPED_TEST_SUITE(device_mlp, configs);

TYPED_TEST(device_mlp, MatchesSerial) {
  WEFT_REQUIRE_DEVICE();
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  const tl::mlp_case ref = tl::mlp_reference<T>(tokens, hidden, ffn, seed, id);
  const dmat &x = ref.x, &dy = ref.dy, &w1 = ref.w1, &b1 = ref.b1, &w2 = ref.w2, &b2 = ref.b2;
  const dmat &y = ref.y, &dx = ref.dx, &dw1 = ref.dw1, &db1 = ref.db1, &dw2 = ref.dw2,
             &db2 = ref.db2;
  const dmat& w1_init = ref.w1_init; // what the layer initialises itself to
  const double tol = tl::tolerance<T>;

  for (int tp = 1; tp <= 4; ++tp) {
    emulated::run(
        tp,
        [&](emulated::communicator& c) {
          weft::traced<emulated::communicator> comm(std::move(c), "tp");
          const cudaStream_t s = comm.stream();
          wl::parallel_mlp<T, decltype(comm), wl::cublas, SP> m(comm, hidden, ffn, seed, id,
                                                                wl::cublas(s));
          const wl::range fr = m.fc1().out_range();
          const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
          const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
          const std::string where =
              "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank());
          auto ps = m.parameters();
          ASSERT_EQ(ps.size(), 4u);
          // The deterministic initialisation reached the device: this rank's rows of the full
          // weight.
          EXPECT_LT(tl::rel_err(download(ps[0].value, s),
                                tl::block(w1_init, fr.begin, fr.size(), 0, hidden)),
                    tol)
              << where;
          upload(w1, fr.begin, 0, ps[0].value, s);
          upload(b1, 0, fr.begin, ps[1].value, s);
          upload(w2, 0, fr.begin, ps[2].value, s);
          upload(b2, 0, 0, ps[3].value, s);
          weft::device_matrix<T> xd(local, hidden, s), dyd(local, hidden, s), yd(local, hidden, s),
              dxd(local, hidden, s);
          upload(x, row0, 0, xd.view(), s);
          upload(dy, row0, 0, dyd.view(), s);
          m.forward(xd.cview(), yd.view());
          const auto fwd = comm.ops();
          comm.clear();
          m.backward(dyd.cview(), dxd.view());
          const auto bwd = comm.ops();
          comm.clear();
          EXPECT_LT(tl::rel_err(download(yd.view(), s), tl::block(y, row0, local, 0, hidden)), tol)
              << where;
          EXPECT_LT(tl::rel_err(download(dxd.view(), s), tl::block(dx, row0, local, 0, hidden)),
                    tol)
              << where;
          EXPECT_LT(
              tl::rel_err(download(ps[0].grad, s), tl::block(dw1, fr.begin, fr.size(), 0, hidden)),
              tol)
              << where;
          EXPECT_LT(tl::rel_err(download(ps[1].grad, s), tl::block(db1, 0, 1, fr.begin, fr.size())),
                    tol)
              << where;
          EXPECT_LT(
              tl::rel_err(download(ps[2].grad, s), tl::block(dw2, 0, hidden, fr.begin, fr.size())),
              tol)
              << where;
          // Under sequence parallelism the replicated fc2 bias holds this rank's rows' share.
          EXPECT_LT(tl::rel_err(download(ps[3].grad, s),
                                SP::enabled ? tl::ref_colsum(dy, row0, local) : db2),
                    tol)
              << where;
          if (tp == 1) {
            EXPECT_TRUE(fwd.empty() && bwd.empty()) << where;
          } else if (SP::enabled) {
            for (const auto* ops : {&fwd, &bwd}) {
              ASSERT_EQ(ops->size(), 2u) << where;
              EXPECT_EQ((*ops)[0].kind, collective::all_gather) << where;
              EXPECT_EQ((*ops)[1].kind, collective::reduce_scatter) << where;
            }
          } else {
            const std::vector<weft::traced_op> one = {
                {collective::all_reduce, tokens * hidden, weft::dtype_of<T>, "tp"}};
            EXPECT_EQ(fwd, one) << where;
            EXPECT_EQ(bwd, one) << where;
          }
          // A second step accumulates: the gradients double, and zero_grad clears them on the
          // device.
          m.forward(xd.cview(), yd.view());
          m.backward(dyd.cview(), dxd.view());
          EXPECT_LT(tl::rel_err(download(ps[0].grad, s),
                                tl::scaled(tl::block(dw1, fr.begin, fr.size(), 0, hidden), 2)),
                    tol)
              << where;
          m.zero_grad();
          for (const auto& p : ps) {
            for (T v : download(p.grad, s).flat())
              ASSERT_EQ(v, T{}) << where << " " << p.name;
          }
          comm.barrier(); // no rank frees its buffers while a peer's queued copy may read them
        },
        {.timeout =
             std::chrono::seconds(60)}); // an ASSERT leaving one rank early fails within a minute
  }
}

// A device policy must queue on the communicator's stream; another stream is refused, naming
// the layer: the linears (through the MLP), the embedding and the loss.
TEST(DeviceMlp, PolicyOnAnotherStreamIsAnError) {
  WEFT_REQUIRE_DEVICE();
  emulated::run(2, [](emulated::communicator& c) {
    weft::cuda::stream other;
    const wl::cublas elsewhere(other.get());
    tl::expect_error(
        [&] {
          wl::parallel_mlp<float, emulated::communicator, wl::cublas> m(c, 4, 8, 1, 1, elsewhere);
        },
        "column_parallel_linear: the policy's stream is not the communicator's stream");
    tl::expect_error(
        [&] {
          wl::vocab_parallel_embedding<float, emulated::communicator, wl::no_sequence_parallel,
                                       wl::cublas>
              e(c, 10, 4, 1, 1, 0.02, elsewhere);
        },
        "vocab_parallel_embedding: the policy's stream is not the communicator's stream");
    tl::expect_error(
        [&] {
          wl::vocab_parallel_cross_entropy<float, emulated::communicator, wl::cublas> l(c, 10,
                                                                                        elsewhere);
        },
        "vocab_parallel_cross_entropy: the policy's stream is not the communicator's stream");
  });
}

} // namespace
