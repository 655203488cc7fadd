// The two-block GPT on the device path: every layer with weft::layer::cublas on the emulated
// ranks' streams (weights, activations, softmax, norms, embedding and loss in device memory), at
// TP = 1..4, with and without sequence parallelism, under each recompute policy, float and double,
// against the host model at TP = 1 (cblas, host memory; itself checked against independent
// references by tests/layer): the loss, the logits and every gradient after one step, and the
// losses of three SGD steps (the update a kernel on each rank's stream), to the layer tests'
// tolerances. The vocabulary (37) divides by none of the TP sizes. And one device block's
// collectives, counted by weft::traced at TP 2: two all-reduces each way (sequence parallelism:
// two all-gathers and two reduce-scatters; full recompute repeats the forward's). Skipped, with
// the reason, without a GPU.
#include <weft/comm/traced.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "layer/gpt_support.hpp"
#include "support/cuda.cuh"

namespace {

using namespace weft::test::layer;
using namespace weft::test::layer::gpt_run;
using weft::layer::no_sequence_parallel;
using weft::layer::sequence_parallel;
namespace recompute = weft::layer::recompute;
namespace emulated = weft::cuda::emulated;

template <class T>
struct sgd_step {
  weft::matrix_view<T> value;
  weft::matrix_view<const T> grad;
  T lr;
  __host__ __device__ void operator()(std::size_t r, std::size_t c) const {
    value(r, c) -= lr * grad(r, c);
  }
};

/// A device view's elements as doubles on the host (waits for s).
template <class T>
dmat download(weft::matrix_view<const T> d, cudaStream_t s) {
  weft::matrix<T> h(d.rows(), d.cols());
  if (h.size() != 0) {
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(h.data(), d.cols() * sizeof(T), d.data(), d.ld() * sizeof(T),
                                    d.cols() * sizeof(T), d.rows(), cudaMemcpyDeviceToHost, s));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  return as_double<T>(h.view());
}

template <class T, class SP, class Recompute>
run_result train_on_device(int tp) {
  const auto ids = ids_from(1);
  const auto targets = ids_from(2);
  run_result out;
  std::mutex mu;
  emulated::run(tp, [&](emulated::communicator& c) {
    const cudaStream_t s = c.stream();
    const weft::layer::cublas gemm(s);
    weft::layer::gpt<T, emulated::communicator, weft::layer::cublas, SP, Recompute> model(c, shape,
                                                                                          99, gemm);
    for (int step = 0; step < steps; ++step) {
      model.zero_grad();
      const double loss = model.forward(ids, targets);
      model.backward();
      if (step == 0) {
        const auto vr = weft::layer::split_range(shape.vocab, tp, c.rank());
        const dmat logits = download(model.logits(), s);
        std::lock_guard lock(mu);
        place(out.grads, "logits", logits.view(), 0, vr.begin, tokens, shape.vocab);
        for (auto& p : model.parameters()) {
          const dmat g = download(weft::matrix_view<const T>(p.grad), s);
          place(out.grads, p.name, g.view(), p.row0, p.col0, p.full_rows, p.full_cols);
        }
      }
      if (c.rank() == 0) {
        std::lock_guard lock(mu);
        out.losses.push_back(loss);
      }
      for (auto& p : model.parameters()) {
        weft::layer::detail::for_each_element(
            gemm, p.value.rows(), p.value.cols(),
            sgd_step<T>{p.value, weft::matrix_view<const T>(p.grad),
                        static_cast<T>(learning_rate)});
      }
    }
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
    c.barrier(); // no rank frees its buffers while a peer's queued copy may read them
  });
  out.logits = std::move(out.grads.at("logits"));
  out.grads.erase("logits");
  return out;
}

template <class T, class SP, class Recompute>
void matches_host_tp1() {
  const run_result one = train<T, no_sequence_parallel, recompute::none>(1);
  for (int tp : {1, 2, 3, 4}) {
    const run_result r = train_on_device<T, SP, Recompute>(tp);
    SCOPED_TRACE("device, tp=" + std::to_string(tp));
    expect_same_training(r, one, tolerance<T>);
  }
}

template <class Recompute>
void every_type_and_sequence_policy() {
  matches_host_tp1<float, no_sequence_parallel, Recompute>();
  matches_host_tp1<double, no_sequence_parallel, Recompute>();
  matches_host_tp1<float, sequence_parallel, Recompute>();
  matches_host_tp1<double, sequence_parallel, Recompute>();
}

TEST(DeviceGpt, MatchesHostTp1) {
  WEFT_REQUIRE_DEVICE();
  every_type_and_sequence_policy<recompute::none>();
}
TEST(DeviceGpt, SelectiveRecomputeMatchesHostTp1) {
  WEFT_REQUIRE_DEVICE();
  every_type_and_sequence_policy<recompute::selective>();
}
TEST(DeviceGpt, FullRecomputeMatchesHostTp1) {
  WEFT_REQUIRE_DEVICE();
  every_type_and_sequence_policy<recompute::full>();
}

struct counts {
  std::size_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
  bool operator==(const counts&) const = default;
};
counts count_ops(const std::vector<weft::traced_op>& ops, std::size_t from, std::size_t to) {
  counts c;
  for (std::size_t i = from; i < to; ++i) {
    c.all_reduce += ops[i].kind == weft::collective::all_reduce ? 1 : 0;
    c.all_gather += ops[i].kind == weft::collective::all_gather ? 1 : 0;
    c.reduce_scatter += ops[i].kind == weft::collective::reduce_scatter ? 1 : 0;
  }
  EXPECT_EQ(c.all_reduce + c.all_gather + c.reduce_scatter, to - from)
      << "a collective of another kind";
  return c;
}

template <class SP, class Recompute>
void device_block_communication(counts fwd, counts bwd) {
  const weft::layer::block_shape bs{.hidden = 8, .heads = 2, .ffn = 16, .seq = 4};
  const std::size_t tokens = 2 * bs.seq;
  emulated::run(2, [&](emulated::communicator& c) {
    using comm = weft::traced<emulated::communicator>;
    comm tp(std::move(c), "tp");
    const cudaStream_t s = tp.stream();
    weft::layer::transformer_block<float, comm, weft::layer::cublas, SP, Recompute> blk(
        tp, bs, 7, 1, weft::layer::cublas(s));
    const std::size_t rows = SP::enabled ? tokens / 2 : tokens;
    const auto host_x = to<float>(random_dmat(rows, bs.hidden, 5));
    auto x = weft::to_device(host_x.view(), s);
    weft::device_matrix<float> y(rows, bs.hidden, s), dx(rows, bs.hidden, s);
    blk.forward(x.cview(), y.view());
    const std::size_t after_forward = tp.ops().size();
    blk.backward(y.cview(), dx.view());
    EXPECT_EQ(count_ops(tp.ops(), 0, after_forward), fwd);
    EXPECT_EQ(count_ops(tp.ops(), after_forward, tp.ops().size()), bwd);
    for (const auto& op : tp.ops()) {
      const std::size_t want =
          op.kind == weft::collective::all_reduce ? tokens * bs.hidden : tokens * bs.hidden / 2;
      EXPECT_EQ(op.count, want) << weft::name_of(op.kind);
    }
    // The block computed something finite on the device.
    for (float v : weft::to_host(dx, s).flat())
      ASSERT_TRUE(std::isfinite(v));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
    tp.barrier();
  });
}

TEST(DeviceBlock, CollectivesAsOnTheHost) {
  WEFT_REQUIRE_DEVICE();
  device_block_communication<no_sequence_parallel, recompute::none>({.all_reduce = 2},
                                                                    {.all_reduce = 2});
  device_block_communication<no_sequence_parallel, recompute::full>({.all_reduce = 2},
                                                                    {.all_reduce = 4});
  device_block_communication<sequence_parallel, recompute::selective>(
      {.all_gather = 2, .reduce_scatter = 2}, {.all_gather = 2, .reduce_scatter = 2});
}

} // namespace
