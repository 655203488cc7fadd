// weft over MPI: every process holds a gradient buffer, and one all-reduce averages them,
// with the hierarchical policy: reduce-scatter within each node, all-reduce across nodes
// (one message per node instead of one per process), all-gather within each node.
//
//   mpirun -n 4 build/samples/02_mpi_all_reduce/weft_mpi_all_reduce
//   WEFT_TOPOLOGY=2x2 mpirun -n 4 build/samples/02_mpi_all_reduce/weft_mpi_all_reduce   (2 emulated
//   nodes) srun -N 2 --ntasks-per-node=8 weft_mpi_all_reduce (Slurm: 2 real nodes)
//
// Nodes are the machines the launcher placed the processes on, or with WEFT_TOPOLOGY set,
// emulated ones (the spec's size must equal the number of processes). As root, Open MPI
// also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, and on a machine
// with fewer cores than processes, mpirun --oversubscribe.
#include <weft/comm/transport/mpi.hpp>
#include <weft/weft.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <span>
#include <vector>

namespace {

// Gradient element i of rank r: small integers, so the average is exact and checkable.
float gradient(int r, std::size_t i) {
  return static_cast<float>((r + 1) * static_cast<int>(i % 7));
}

} // namespace

int main(int argc, char** argv) {
  weft::mpi::environment env(argc, argv);
  try {
    auto world = weft::mpi::world();
    const int p = world.size();
    const std::size_t n = std::size_t{4} << 20; // 4 Mi floats: a 16 MiB gradient
    std::vector<float> grad(n);
    for (std::size_t i = 0; i < n; ++i)
      grad[i] = gradient(world.rank(), i);

    using policy = weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>;
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    weft::all_reduce<policy>(world, std::span(grad), weft::op::avg{});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    // The average of (r + 1) * (i % 7) over r = 0 .. p-1 is (p + 1) / 2 * (i % 7).
    long long wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(p + 1) / 2.0f * static_cast<float>(i % 7);
      wrong += grad[i] == want ? 0 : 1;
    }
    long long wrong_anywhere = 0;
    MPI_Allreduce(&wrong, &wrong_anywhere, 1, MPI_LONG_LONG, MPI_SUM, world.native());
    if (world.rank() == 0) {
      std::printf(
          "%d processes on %d %s node%s; all_reduce<%s> avg of %zu MiB: %.2f ms on rank 0, %s\n", p,
          world.cluster().nodes(), world.emulated_nodes() ? "emulated" : "real",
          world.cluster().nodes() == 1 ? "" : "s", std::string(policy::name).c_str(),
          n * sizeof(float) >> 20, ms, wrong_anywhere == 0 ? "every element right" : "WRONG");
    }
    return wrong_anywhere == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    // A failed rank takes the job down with it, so that no other process waits for it.
    std::fprintf(stderr, "%s\n", e.what());
    env.abort(1);
    return 1;
  }
}
