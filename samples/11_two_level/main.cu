// A gradient all-reduced over every GPU of every node, one MPI process per GPU, with each level
// on the transport that suits its link: weft::cuda::p2p (peer loads over NVLink) inside a node
// and NCCL (InfiniBand) across nodes, as one weft::cuda::two_level.
//
//   # 2 nodes of 8 GPUs
//   mpirun -n 16 --map-by ppr:8:node build/samples/11_two_level/weft_two_level
//   # one GPU: one level
//   mpirun -n 1 build/samples/11_two_level/weft_two_level
//
// Each rank's gradient holds rank + 1 everywhere, so the sum is p(p+1)/2 in every element:
// the program checks all of them after each algorithm, then prints the time per call and the
// bus bandwidth (2(p-1)/p x bytes / time, nccl-tests' convention).
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/cuda/two_level_mpi.cuh>

#include <mpi.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

__global__ void fill(float* x, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += std::size_t{blockDim.x} * gridDim.x)
    x[i] = v;
}

template <class Algo>
bool run(weft::cuda::mpi_two_level& world, float* grad, std::size_t n, const char* name) {
  const int p = world.size();
  const cudaStream_t s = world.stream();
  fill<<<1024, 256, 0, s>>>(grad, n, static_cast<float>(world.rank() + 1));
  weft::all_reduce<Algo>(world, std::span(grad, n)); // warm-up, and the call checked below
  std::vector<float> back(n);
  WEFT_CUDA_TRY(cudaMemcpyAsync(back.data(), grad, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  const float want = static_cast<float>(p) * static_cast<float>(p + 1) / 2;
  std::size_t wrong = 0;
  for (float v : back)
    wrong += v != want ? 1 : 0;
  const weft::cuda::event start(true), stop(true);
  constexpr int iterations = 10;
  start.record(s);
  for (int i = 0; i < iterations; ++i)
    weft::all_reduce<Algo>(world, std::span(grad, n));
  stop.record(s);
  const double seconds = stop.elapsed_ms(start) / 1e3 / iterations;
  int all_wrong = 0;
  const int mine = wrong != 0 ? 1 : 0;
  MPI_Allreduce(&mine, &all_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world.rank() == 0) {
    const double bytes = static_cast<double>(n * sizeof(float));
    std::printf("%-24s %9.3f ms  busbw %7.1f GB/s  %s\n", name, seconds * 1e3,
                p > 1 ? 2.0 * (p - 1) / p * bytes / seconds / 1e9 : 0.0,
                all_wrong == 0 ? "every element right" : "WRONG on some ranks");
  }
  return all_wrong == 0;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (const std::string why = weft::cuda::no_device_reason(); !why.empty()) {
    if (rank == 0) std::printf("weft_two_level: %s; nothing to run\n", why.c_str());
    MPI_Finalize();
    return 0;
  }
  int ok = 1;
  {
    // Each process on its GPU first: the local rank among the processes of this node.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int devices = 1;
    WEFT_CUDA_TRY(cudaGetDeviceCount(&devices));
    WEFT_CUDA_TRY(cudaSetDevice(local % devices));

    auto world = weft::cuda::two_level_from_mpi(MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("%d ranks in %d nodes, %d leaders per node; 64 MiB of float per rank\n",
                  world.size(), world.nodes(), world.min_ranks_per_node());
    }
    const std::size_t n = std::size_t{16} << 20;
    weft::cuda::device_buffer<float> grad(n);
    ok &= run<weft::algo::levels<>>(world, grad.data(), n, "levels<automatic>") ? 1 : 0;
    ok &= run<weft::algo::levels<weft::algo::direct, weft::algo::vendor>>(world, grad.data(), n,
                                                                          "levels<direct, vendor>")
              ? 1
              : 0;
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
