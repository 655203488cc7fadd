// A GPT trained with tensor parallelism on GPUs: the layers of weft/layer with the cuBLAS policy
// keep weights and activations in device memory and run on each rank's stream; the TP group's
// collectives go through NCCL. Under mpirun, one process per GPU (2 or 4 of them; NCCL from MPI,
// weft::cuda::nccl::from_mpi). Run alone: two TP ranks emulated on GPU 0 (weft::cuda::emulated).
// Beside it the same model at TP = 1 on one GPU. Both print their losses per step; they must agree
// to float rounding (the model is initialised over the full shapes from one seed, so it is the
// same model at every TP size).
//
//   # one GPU per process
//   mpirun -n 2 build/samples/10_device_gpt/weft_device_gpt [--steps N]
//   # TP 2 emulated on one GPU
//   build/samples/10_device_gpt/weft_device_gpt
//
// One process per GPU, not one thread per GPU: cudaMalloc and cudaFree in one thread can wait
// behind an NCCL kernel that another thread's peer has not launched yet (a known NCCL hazard).
// Without a CUDA device it says so and exits 0.
#include <weft/comm/transport/mpi.hpp>
#include <weft/cuda.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/nccl_mpi.cuh>
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/gpt.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace wl = weft::layer;

constexpr wl::gpt_shape shape{
    .vocab = 1000, .hidden = 256, .heads = 8, .ffn = 0, .seq = 64, .layers = 2};
constexpr std::size_t batch = 4;
constexpr float learning_rate = 0.05f;

// Plain SGD on one shard, as a layer runs its element-wise steps (weft/layer/exec.hpp).
struct sgd {
  weft::matrix_view<float> value;
  weft::matrix_view<const float> grad;
  __host__ __device__ void operator()(std::size_t r, std::size_t c) const {
    value(r, c) -= learning_rate * grad(r, c);
  }
};

// A fixed pseudo-random corpus: batch sequences of ids and their next-token targets.
std::vector<std::int32_t> tokens(std::uint32_t seed) {
  std::vector<std::int32_t> v(batch * shape.seq);
  for (auto& t : v) {
    seed = seed * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((seed >> 8) % shape.vocab);
  }
  return v;
}

// Trains `steps` steps on this rank; returns the losses (every rank computes the same).
template <class Comm>
std::vector<double> train(Comm& tp, int steps) {
  const wl::cublas gemm(tp.stream());
  wl::gpt<float, Comm, wl::cublas, wl::sequence_parallel, wl::recompute::selective> model(tp, shape,
                                                                                          42, gemm);
  const auto ids = tokens(1), targets = tokens(2);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    losses.push_back(model.forward(ids, targets)); // waits for the loss
    model.backward();
    for (auto& p : model.parameters()) {
      wl::detail::for_each_element(gemm, p.value.rows(), p.value.cols(), sgd{p.value, p.grad});
    }
  }
  if (cudaStreamSynchronize(tp.stream()) != cudaSuccess)
    throw std::runtime_error("cudaStreamSynchronize failed");
  return losses;
}

} // namespace

int main(int argc, char** argv) {
  weft::mpi::environment env(argc, argv);
  int steps = 5;
  auto world = weft::mpi::world();
  const bool root = world.rank() == 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0) {
      // A whole number from 1 up: atoi read "abc" as 0, and the sample ran 1 step unasked.
      const char* v = argv[i + 1];
      const char* end = v + std::strlen(v);
      const auto [stop, ec] = std::from_chars(v, end, steps);
      if (ec != std::errc{} || stop != end || steps < 1) {
        if (root)
          std::fprintf(stderr, "weft_device_gpt: --steps takes a whole number from 1, not '%s'\n",
                       v);
        return 2;
      }
    }
  }
  int gpus = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    if (root) {
      std::printf("no CUDA device here (%s): nothing to run\n",
                  e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    }
    return 0;
  }
  try {
    const int tp = world.size();
    if (tp > 1 && (tp > gpus || shape.heads % static_cast<std::size_t>(tp) != 0)) {
      throw std::runtime_error("run 2 or 4 processes, one per GPU (" + std::to_string(gpus) +
                               " here)");
    }
    // TP = 1 on this process's GPU, for the comparison.
    if (cudaSetDevice(tp > 1 ? world.rank() % gpus : 0) != cudaSuccess)
      throw std::runtime_error("cudaSetDevice failed");
    std::vector<double> one;
    weft::cuda::emulated::run(
        1, [&](weft::cuda::emulated::communicator& c) { one = train(c, steps); });

    std::vector<double> split;
    std::string how;
    if (tp > 1) {
      auto gpu_comm = weft::cuda::nccl::from_mpi(MPI_COMM_WORLD);
      split = train(gpu_comm, steps);
      how = "TP " + std::to_string(tp) + " on " + std::to_string(tp) + " GPUs";
    } else {
      weft::cuda::emulated::run(2, [&](weft::cuda::emulated::communicator& c) {
        auto losses = train(c, steps);
        if (c.rank() == 0) split = std::move(losses);
      });
      how = "TP 2 emulated";
    }
    if (!root) return 0;
    std::printf(
        "GPT (vocab %zu, hidden %zu, %zu heads, seq %zu, %zu layers), batch %zu, SGD, sequence "
        "parallel,"
        " selective recompute, float on the device\n",
        shape.vocab, shape.hidden, shape.heads, shape.seq, shape.layers, batch);
    std::printf("%6s %14s %16s\n", "step", "TP 1", how.c_str());
    double worst = 0;
    int not_finite = 0; // the first step (from 1) whose losses differ by NaN or infinity
    for (int s = 0; s < steps; ++s) {
      const auto i = static_cast<std::size_t>(s);
      std::printf("%6d %14.6f %16.6f\n", s + 1, one[i], split[i]);
      // std::max(worst, NaN) is worst: a NaN or infinite loss is caught on its own.
      const double diff = std::abs(split[i] - one[i]) / std::abs(one[i]);
      if (!std::isfinite(diff)) {
        if (not_finite == 0) not_finite = s + 1;
      } else {
        worst = std::max(worst, diff);
      }
    }
    const bool same = not_finite == 0 && worst < 1e-4;
    if (not_finite != 0) {
      std::printf("at step %d a loss is not a finite number: DIFFERENT\n", not_finite);
    } else {
      std::printf("largest relative difference %.2e: %s\n", worst,
                  same ? "the same training" : "DIFFERENT");
    }
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
    return 1;
  }
}
