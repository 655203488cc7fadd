// What weft-perf's buffers need against what the machine can give, checked before any is
// allocated: an over-large -e is refused with a message instead of being killed by the
// kernel's out-of-memory handler part way through (Linux overcommits, so the allocation
// itself succeeds and the pages fail later).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace weft::perf {

/// Bytes this machine can still give a process: /proc/meminfo's MemAvailable (the whole
/// machine's physical memory where it cannot be read), capped by a cgroup v2 limit
/// (memory.max less memory.current) where one is set.
inline std::optional<std::uint64_t> available_memory() {
  std::optional<std::uint64_t> avail;
  if (std::ifstream meminfo("/proc/meminfo"); meminfo) {
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
      if (key == "MemAvailable:") {
        avail = kib * 1024;
        break;
      }
    }
  }
  if (!avail) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      avail = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  }
  std::uint64_t max = 0;
  std::uint64_t current = 0;
  if (std::ifstream f("/sys/fs/cgroup/memory.max"); f >> max) { // "max" (no limit) fails to parse
    if (std::ifstream g("/sys/fs/cgroup/memory.current"); g >> current) {
      const std::uint64_t left = max > current ? max - current : 0;
      if (!avail || left < *avail) avail = left;
    }
  }
  return avail;
}

/// weft-perf allocates an input and an output of max_bytes for every rank (run_table); the
/// transports stage little beside them (measured: 4 ranks at -e 256M peak at 2.01 GiB of
/// resident memory, the buffers' 2.00). `ranks_here` ranks share this machine's memory.
/// Returns what is wrong, or "" when the buffers fit in `available` bytes.
inline std::string memory_problem(std::size_t max_bytes, std::size_t ranks_here,
                                  std::optional<std::uint64_t> available) {
  if (!available) return {};
  const long double need =
      2.0L * static_cast<long double>(max_bytes) * static_cast<long double>(ranks_here);
  if (need <= static_cast<long double>(*available)) return {};
  const auto gib = [](long double b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB",
                  static_cast<double>(b / (1024.0L * 1024.0L * 1024.0L)));
    return std::string(text);
  };
  return "-e " + gib(static_cast<long double>(max_bytes)) +
         " needs an input and an output buffer of that size for each of " +
         std::to_string(ranks_here) + " ranks on this machine, " + gib(need) + " in all, and " +
         gib(static_cast<long double>(*available)) +
         " is available: use a smaller -e or fewer ranks";
}

} // namespace weft::perf
