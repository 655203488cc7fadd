// An ordinary multi-GPU CUDA program, and weft added to it. The program already has what
// such programs have: gradient buffers in thrust::device_vector, a stream per GPU, an NCCL
// communicator from ncclCommInitAll over the visible devices, and a host thread per GPU for its
// training steps. weft comes in with the lines marked "weft": its headers, a communicator that
// borrows the program's NCCL communicator and stream (weft never destroys either; the
// program keeps using both), and one call in the step. Nothing else changes.
//
// The call names no algorithm: the default (algo::automatic) prices NCCL's own ncclAllReduce
// with a model of NCCL's tuning beside weft's plans and takes NCCL's unless a plan of weft's
// is cheaper. The sample prints which it took (weft::automatic_choice) and both prices.
//
//   build/samples/03_cuda_existing_program/weft_cuda_existing_program
//
// Without a CUDA device it says so and exits 0.
#include <weft/cuda.hpp> // weft

#include <cuda_runtime.h>
#include <nccl.h>
#include <thrust/device_vector.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// The program's own error checks.
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// Gradient element i on GPU d: small integers, so the average is exact and checkable.
__global__ void fill_gradient(float* g, std::size_t n, int d) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    g[i] = static_cast<float>((d + 1) * static_cast<int>(i % 7));
  }
}

} // namespace

int main() {
  int gpus = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    std::printf("no CUDA device here (%s): nothing to run\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    return 0;
  }
  try {
    const std::size_t n = std::size_t{4} << 20; // 4 Mi floats: a 16 MiB gradient per GPU
    const int steps = 3;
    std::vector<int> devices(static_cast<std::size_t>(gpus));
    std::iota(devices.begin(), devices.end(), 0);
    std::vector<ncclComm_t> comms(devices.size());
    nccl_ok(ncclCommInitAll(comms.data(), gpus, devices.data()), "ncclCommInitAll");
    std::vector<cudaStream_t> streams(devices.size());
    std::vector<thrust::device_vector<float>> grads(devices.size());
    for (int d : devices) {
      cuda_ok(cudaSetDevice(d), "cudaSetDevice");
      cuda_ok(cudaStreamCreate(&streams[d]), "cudaStreamCreate");
      grads[d].resize(n); // on device d, the current one
    }

    // The training step, one host thread per GPU.
    std::vector<std::vector<float>> results(devices.size());
    std::vector<std::string> failures(devices.size());
    std::vector<double> ms(devices.size());
    std::string chosen; // what the default algorithm took, seen from GPU 0
    std::vector<std::thread> threads;
    for (int d : devices) {
      threads.emplace_back([&, d] {
        try {
          cuda_ok(cudaSetDevice(d), "cudaSetDevice");
          // weft: the program's communicator and stream, borrowed once for all the steps.
          auto comm = weft::cuda::nccl::communicator::borrow(comms[d], streams[d]);
          if (d == 0) {
            // weft: which algorithm the default takes for this call, and the modelled prices.
            const weft::algo::choice c =
                weft::automatic_choice<weft::collective::all_reduce, float, weft::op::avg>(comm, n);
            char line[256];
            std::snprintf(line, sizeof line,
                          "default algorithm: %s (NCCL's ncclAllReduce modelled at %.3f ms, "
                          "weft's best plan %s at %.3f ms)",
                          std::string(c.name()).c_str(), c.vendor_seconds.value_or(0) * 1e3,
                          c.plan != nullptr ? std::string(c.plan->name).c_str() : "none",
                          c.plan_seconds * 1e3);
            chosen = line;
          }
          for (int step = 0; step < steps; ++step) {
            float* g = thrust::raw_pointer_cast(grads[d].data());
            fill_gradient<<<256, 256, 0, streams[d]>>>(g, n, d);
            cuda_ok(cudaGetLastError(), "fill_gradient");
            const auto t0 = std::chrono::steady_clock::now();

            // weft: average the gradient over the GPUs (the algorithm is chosen for the machine).
            weft::all_reduce(comm, std::span(g, n), weft::op::avg{});

            // The program goes on as before, on its own stream.
            results[d].resize(n);
            cuda_ok(cudaMemcpyAsync(results[d].data(), g, n * sizeof(float), cudaMemcpyDeviceToHost,
                                    streams[d]),
                    "cudaMemcpyAsync");
            cuda_ok(cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
            ms[d] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
          }
        } catch (const std::exception& e) {
          failures[d] = e.what();
        }
      });
    }
    for (auto& t : threads)
      t.join();

    bool right = true;
    for (int d : devices) {
      if (!failures[d].empty())
        throw std::runtime_error("GPU " + std::to_string(d) + ": " + failures[d]);
      // The average of (d + 1) * (i % 7) over d = 0 .. gpus-1 is (gpus + 1) / 2 * (i % 7).
      for (std::size_t i = 0; i < n && right; ++i) {
        right = results[d][i] == static_cast<float>(gpus + 1) / 2.0f * static_cast<float>(i % 7);
      }
    }
    std::printf(
        "%d GPU%s: weft::all_reduce avg of %zu MiB on the program's own NCCL communicator: "
        "%.2f ms on GPU 0 (step %d), %s\n",
        gpus, gpus == 1 ? "" : "s", n * sizeof(float) >> 20, ms[0], steps,
        right ? "every element right" : "WRONG");
    std::printf("%s\n", chosen.c_str());

    for (int d : devices) {
      cuda_ok(cudaSetDevice(d), "cudaSetDevice");
      nccl_ok(ncclCommDestroy(comms[d]), "ncclCommDestroy");
      grads[d].clear(); // freed on its own device
      grads[d].shrink_to_fit();
      cuda_ok(cudaStreamDestroy(streams[d]), "cudaStreamDestroy");
    }
    return right ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
