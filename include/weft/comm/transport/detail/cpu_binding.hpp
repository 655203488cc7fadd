#pragma once
// Binding local::run's rank threads to CPUs. Where the ranks outnumber the CPUs, which ranks
// share a CPU decides how fast each algorithm runs, and an unbound scheduler changes that
// while a program runs: 4 ranks on 2 cores ran all_reduce at 16 KiB in 6.3 us (recursive
// doubling) with ranks 0 and 2 on one core, 1 and 3 on the other, and in 11-13 us (any
// algorithm) with the threads free, the fastest algorithm changing from one run to the next
// and within one; algo::automatic, which measures the candidates at its first call, then
// picked for a placement that was gone (docs/benchmarks.md).
//
// Bound, each rank runs on its share of the CPUs the thread that called local::run may run
// on, taken in the operating system's order (logical CPUs, not grouped by core): where the
// ranks outnumber them, rank r on the (r mod n)-th of n, round robin; else rank r on the r-th
// block of floor(n / ranks). Threads a rank starts inherit its CPUs. Binding is asked for
// (local::options::binding), and Linux only: a bound thread cannot leave a CPU that another
// process keeps busy, which is why threads, like MPI processes that outnumber the cores, run
// free by default.
#include <weft/core/error.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>

#include <cerrno>
#endif

namespace weft::detail {

/// The CPUs the calling thread may run on, ascending; empty where the platform cannot say
/// (not Linux).
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  // glibc's cpu_set_t holds 1,024 CPUs; the kernel refuses a set smaller than its own.
  for (int n = 1024; n <= (1 << 20) && cpus.empty(); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) break;
    const std::size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const bool read = sched_getaffinity(0, bytes, set) == 0;
    const int why = errno;
    if (read)
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (!read && why != EINVAL) break;
  }
#endif
  return cpus;
}

/// How many CPUs the calling thread may run on: its affinity, else (where the platform cannot
/// say) the hardware's count, at least 1.
inline std::size_t usable_cpus() {
  const std::size_t allowed = allowed_cpus().size();
  if (allowed > 0) return allowed;
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? hardware : 1;
}

/// Runs the calling thread on `cpus` only: 0, or the error number of the refusal.
inline int run_this_thread_on(std::span<const int> cpus) {
#if defined(__linux__)
  int n = 1;
  for (int c : cpus)
    n = c + 1 > n ? c + 1 : n;
  cpu_set_t* set = CPU_ALLOC(n);
  if (set == nullptr) return ENOMEM;
  const std::size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set);
  for (int c : cpus)
    CPU_SET_S(c, bytes, set);
  const int failed = sched_setaffinity(0, bytes, set) == 0 ? 0 : errno;
  CPU_FREE(set);
  return failed;
#else
  (void)cpus;
  return static_cast<int>(std::errc::function_not_supported);
#endif
}

/// The CPUs rank r of `ranks` is bound to, of the CPUs the run may use (see the top).
inline std::vector<int> cpus_of_rank(int r, int ranks, std::span<const int> cpus) {
  WEFT_EXPECTS(r >= 0 && r < ranks && !cpus.empty(), "cpus_of_rank: a rank and at least one CPU");
  const auto n = cpus.size();
  const auto rank = static_cast<std::size_t>(r);
  if (static_cast<std::size_t>(ranks) >= n) return {cpus[rank % n]};
  const std::size_t block = n / static_cast<std::size_t>(ranks);
  return {cpus.begin() + static_cast<std::ptrdiff_t>(rank * block),
          cpus.begin() + static_cast<std::ptrdiff_t>((rank + 1) * block)};
}

/// CPUs as the reports name them: "0,2,5".
inline std::string cpu_list(std::span<const int> cpus) {
  std::string list;
  for (int c : cpus) {
    if (!list.empty()) list += ',';
    list += std::to_string(c);
  }
  return list;
}

/// Binds the calling thread to `cpus` while it lives, and gives the thread its former CPUs
/// back when it ends (rank 0 runs on the caller's thread). Where the thread cannot be bound
/// (or its former CPUs cannot be read, to give back), it throws when `required`, else leaves
/// the thread as it was.
class cpu_binding {
public:
  cpu_binding(std::span<const int> cpus, bool required, int rank) : former_(allowed_cpus()) {
    const int failed = former_.empty() ? static_cast<int>(std::errc::function_not_supported)
                                       : run_this_thread_on(cpus);
    bound_ = failed == 0;
    if (!bound_ && required)
      throw error("weft: local::run: could not bind rank " + std::to_string(rank) +
                  "'s thread to CPU " + cpu_list(cpus) + " (" +
                  std::system_category().message(failed) +
                  "); run with local::options::binding none (or WEFT_BINDING=none)");
  }
  ~cpu_binding() {
    if (bound_) (void)run_this_thread_on(former_);
  }
  cpu_binding(const cpu_binding&) = delete;
  cpu_binding& operator=(const cpu_binding&) = delete;

private:
  std::vector<int> former_;
  bool bound_ = false;
};

} // namespace weft::detail
