#pragma once
// MPI's own collectives as a peer of weft in the benchmarks: MPI_Allreduce,
// MPI_Reduce_scatter_block and MPI_Allgather on float sums, timed the same way on every rank.
//
//   using namespace weft::bench::mpi_peer;
//   // seconds per call
//   double s = time_operation(operation::all_reduce, MPI_COMM_WORLD, count, 20);
//   bool ok = check(operation::all_reduce, MPI_COMM_WORLD, count);      // against a plain loop
//
// All functions are collective: every rank of `comm` calls them with the same arguments.
// `count` is in elements per rank, with nccl-tests' meaning: all-reduce has count in and
// count out; reduce-scatter count*p in and count out; all-gather count in and count*p out.
// Link the CMake target weft_bench_mpi_peer (it exists where weft::mpi does).
//
// Each function first waits for all ranks without spinning (polite_barrier), so ranks that
// wait while rank 0 runs a threaded peer (Gloo) leave the cores to it.
#include <weft/comm/transport/detail/mpi_error.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace weft::bench::mpi_peer {

enum class operation { all_reduce, reduce_scatter, all_gather };

/// The MPI function each operation calls.
[[nodiscard]] constexpr std::string_view name(operation op) noexcept {
  switch (op) {
    case operation::all_reduce: return "MPI_Allreduce";
    case operation::reduce_scatter: return "MPI_Reduce_scatter_block";
    case operation::all_gather: return "MPI_Allgather";
  }
  return "?";
}

/// nccl-tests' bus-bandwidth factor: 2(p-1)/p for all-reduce, (p-1)/p for the other two.
[[nodiscard]] constexpr double bus_factor(operation op, int p) noexcept {
  if (p <= 1) return 1.0;
  return op == operation::all_reduce ? 2.0 * (p - 1) / p : static_cast<double>(p - 1) / p;
}

/// Elements of the input and output buffers on one rank for `count` elements per rank.
[[nodiscard]] constexpr std::size_t input_count(operation op, std::size_t count, int p) noexcept {
  return op == operation::reduce_scatter ? count * static_cast<std::size_t>(p) : count;
}
[[nodiscard]] constexpr std::size_t output_count(operation op, std::size_t count, int p) noexcept {
  return op == operation::all_gather ? count * static_cast<std::size_t>(p) : count;
}

/// A barrier that sleeps while it waits. MPI_Barrier polls at full speed; on a machine with
/// fewer cores than ranks the waiting ranks would take the cores from the one still working.
inline void polite_barrier(MPI_Comm comm,
                           std::chrono::microseconds poll = std::chrono::microseconds(200)) {
  MPI_Request request = MPI_REQUEST_NULL;
  WEFT_MPI_TRY(MPI_Ibarrier(comm, &request), "polite_barrier");
  for (;;) {
    int done = 0;
    WEFT_MPI_TRY(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "polite_barrier");
    if (done != 0) return;
    std::this_thread::sleep_for(poll);
  }
}

namespace detail {

// Small integers: every order of summation gives the exact float answer.
inline float check_input(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 5 + i * 3) % 13) -
                            6);
}

inline int comm_size(MPI_Comm comm) {
  int p = 0;
  WEFT_MPI_TRY(MPI_Comm_size(comm, &p));
  return p;
}

inline int comm_rank(MPI_Comm comm) {
  int r = 0;
  WEFT_MPI_TRY(MPI_Comm_rank(comm, &r));
  return r;
}

inline int checked_count(std::size_t count) {
  // MPI's counts are ints; the larger buffer of reduce-scatter and all-gather has no count.
  WEFT_EXPECTS(count <= static_cast<std::size_t>(INT_MAX), "MPI counts elements in an int");
  return static_cast<int>(count);
}

inline void call(operation op, MPI_Comm comm, const float* in, float* out, int count) {
  switch (op) {
    case operation::all_reduce:
      WEFT_MPI_TRY(MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, comm), "MPI_Allreduce");
      return;
    case operation::reduce_scatter:
      WEFT_MPI_TRY(MPI_Reduce_scatter_block(in, out, count, MPI_FLOAT, MPI_SUM, comm),
                   "MPI_Reduce_scatter_block");
      return;
    case operation::all_gather:
      WEFT_MPI_TRY(MPI_Allgather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, comm),
                   "MPI_Allgather");
      return;
  }
}

} // namespace detail

/// Seconds per call of the collective `call`, the same on all ranks: after one untimed warm-up
/// call, `repetitions` runs of `iterations` back-to-back calls, each after an MPI_Barrier, each
/// run timed by its slowest rank (MPI_MAX, as weft-perf does: a root that returns early would
/// report a broadcast faster than it was); the best run's mean. `iterations` and `repetitions`
/// must be the same on every rank. Every MPI-side row of the suite (MPI's and weft's) is timed so.
template <class Call>
double time_calls(MPI_Comm comm, int iterations, int repetitions, Call&& call) {
  WEFT_EXPECTS(iterations >= 1 && repetitions >= 1, "iterations and repetitions must be positive");
  polite_barrier(comm);
  call();
  double best = 1e300;
  for (int rep = 0; rep < repetitions; ++rep) {
    WEFT_MPI_TRY(MPI_Barrier(comm), "time_calls");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i)
      call();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    WEFT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, comm), "time_calls");
    best = std::min(best, s / iterations);
  }
  return best;
}

/// Seconds per call of `op` on `count` elements per rank (out of place, float sum), timed by
/// time_calls.
inline double time_operation(operation op, MPI_Comm comm, std::size_t count, int iterations,
                             int repetitions = 3) {
  const int n = detail::checked_count(count);
  const int p = detail::comm_size(comm);
  std::vector<float> in(input_count(op, count, p), 1.0f);
  std::vector<float> out(output_count(op, count, p));
  return time_calls(comm, iterations, repetitions,
                    [&] { detail::call(op, comm, in.data(), out.data(), n); });
}

inline double time_all_reduce(MPI_Comm comm, std::size_t count, int iterations,
                              int repetitions = 3) {
  return time_operation(operation::all_reduce, comm, count, iterations, repetitions);
}
inline double time_reduce_scatter(MPI_Comm comm, std::size_t count, int iterations,
                                  int repetitions = 3) {
  return time_operation(operation::reduce_scatter, comm, count, iterations, repetitions);
}
inline double time_all_gather(MPI_Comm comm, std::size_t count, int iterations,
                              int repetitions = 3) {
  return time_operation(operation::all_gather, comm, count, iterations, repetitions);
}

/// Elements, summed over all ranks, where one call of `op` on small integers differs from a
/// plain-loop reference; the same number on every rank. 0 means MPI's answer is right.
inline long long count_wrong(operation op, MPI_Comm comm, std::size_t count) {
  const int n = detail::checked_count(count);
  const int p = detail::comm_size(comm);
  const int me = detail::comm_rank(comm);
  std::vector<float> in(input_count(op, count, p));
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = detail::check_input(me, i);
  std::vector<float> out(output_count(op, count, p));
  polite_barrier(comm);
  detail::call(op, comm, in.data(), out.data(), n);
  long long wrong = 0;
  const auto sum_over_ranks = [&](std::size_t i) {
    float s = 0;
    for (int q = 0; q < p; ++q)
      s += detail::check_input(q, i);
    return s;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    float want = 0;
    switch (op) {
      case operation::all_reduce: want = sum_over_ranks(i); break;
      // Rank me keeps block me of the reduced count*p vector.
      case operation::reduce_scatter:
        want = sum_over_ranks(static_cast<std::size_t>(me) * count + i);
        break;
      // Block q of the output is rank q's input.
      case operation::all_gather:
        want = detail::check_input(static_cast<int>(i / count), i % count);
        break;
    }
    wrong += out[i] == want ? 0 : 1;
  }
  long long total = 0;
  WEFT_MPI_TRY(MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, comm),
               std::string(name(op)));
  return total;
}

/// Whether one call of `op` on `count` elements per rank gives the exact answer on every rank.
inline bool check(operation op, MPI_Comm comm, std::size_t count) {
  return count_wrong(op, comm, count) == 0;
}

} // namespace weft::bench::mpi_peer
