#pragma once
// For GPU tests of the device transports: moving a rank's data to and from the device, its
// reusable device buffers, and one collective call on device buffers checked against the
// serial reference of support/reference.hpp, for any communicator (one-GPU harness, p2p).
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/memory.cuh>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/reference.hpp"

namespace weft::test::device {

template <class T>
void upload(T* dst, const std::vector<T>& src, cudaStream_t s) {
  if (!src.empty())
    WEFT_CUDA_TRY(
        cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

// Polls until s is idle, failing after `limit`: the wait before a copy to pageable memory,
// which blocks this thread until done and may hold back other threads' CUDA calls meanwhile
// (staging buffers), while this rank's queued p2p sync spins until those threads' ranks
// launch theirs.
inline void wait_idle(cudaStream_t s, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const cudaError_t e =
      weft::cuda::detail::poll_stream(s, std::chrono::steady_clock::now() + limit);
  if (e == cudaErrorNotReady) {
    throw weft::error("test download: the stream was not idle after " +
                      std::to_string(limit.count()) + " s");
  }
  WEFT_CUDA_TRY(e);
}

template <class T>
std::vector<T> download(const T* src, std::size_t n, cudaStream_t s) {
  wait_idle(s);
  std::vector<T> v(n);
  if (n != 0)
    WEFT_CUDA_TRY(cudaMemcpyAsync(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  return v;
}

// A rank's device buffers, grown and reused across calls (a cudaMalloc per call would
// dominate the sweep). Replacing one is safe: the rank's stream is idle after each check,
// and every peer's read of its buffers is ordered before that (or peers never read them).
// Stream-ordered (cudaMallocAsync on the rank's stream): a cudaFree would wait for the whole
// device, and with p2p ranks sharing one, for a peer's flag sync that waits for this rank.
class rank_memory {
public:
  explicit rank_memory(cudaStream_t s) : s_(s) {}
  template <class T>
  T* input(std::size_t n) {
    return at_least<T>(in_, n);
  }
  template <class T>
  T* output(std::size_t n) {
    return at_least<T>(out_, n);
  }

private:
  template <class T>
  T* at_least(weft::cuda::stream_buffer<std::byte>& b, std::size_t n) {
    if (b.size() < n * sizeof(T)) b.allocate(std::max(n * sizeof(T), 2 * b.size()), s_);
    return reinterpret_cast<T*>(b.data());
  }
  cudaStream_t s_;
  weft::cuda::stream_buffer<std::byte> in_;
  weft::cuda::stream_buffer<std::byte> out_;
};

// Every rank's output of one call, to compare them bit for bit.
struct shared_outputs {
  explicit shared_outputs(int p) : bytes(static_cast<std::size_t>(p)) {}
  std::vector<std::vector<std::byte>> bytes;
};

template <class T, class Comm>
void expect_identical(Comm& c, shared_outputs& shared, const std::vector<T>& mine,
                      const std::string& what) {
  auto& slot = shared.bytes[static_cast<std::size_t>(c.rank())];
  slot.resize(mine.size() * sizeof(T));
  if (!mine.empty()) std::memcpy(slot.data(), mine.data(), slot.size());
  c.barrier();
  if (c.rank() != 0) {
    EXPECT_TRUE(slot == shared.bytes[0]) << what << ": rank " << c.rank() << " differs from rank 0";
  }
  c.barrier();
}

constexpr bool replicates(collective c) {
  return c == collective::all_reduce || c == collective::all_gather || c == collective::broadcast;
}

/// One call of collective C with algorithm Algo on device buffers, checked against the
/// reference (and the input checked unchanged). Returns the rank's output.
template <class Algo, collective C, class T, class Op, class Comm>
std::vector<T> call_and_check(Comm& c, rank_memory& mem, std::size_t count, int root,
                              test::pattern pat, bool in_place) {
  const int p = c.size();
  const int r = c.rank();
  std::vector<std::vector<T>> inputs(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    for (std::size_t i = 0; i < test::input_count(C, p, count); ++i) {
      inputs[static_cast<std::size_t>(s)].push_back(test::input_value<T, Op>(s, i, pat));
    }
  }
  const auto want = test::reference<T, Op>(C, p, count, root, inputs)[static_cast<std::size_t>(r)];
  const std::vector<T>& mine = inputs[static_cast<std::size_t>(r)];
  const std::size_t out_n = test::output_count(C, p, count, r, root);
  const cudaStream_t s = c.stream();
  T* in = mem.input<T>(mine.size());
  T* out = mem.output<T>(out_n);
  upload(in, mine, s);
  if (out_n != 0)
    WEFT_CUDA_TRY(cudaMemsetAsync(out, 0xa5, out_n * sizeof(T), s)); // what no step wrote shows
  if constexpr (C == collective::all_reduce) {
    if (in_place) {
      upload(out, mine, s);
      all_reduce<Algo>(c, std::span(out, count), Op{});
    } else {
      all_reduce<Algo>(c, std::span<const T>(in, count), std::span(out, count), Op{});
    }
  } else if constexpr (C == collective::reduce_scatter) {
    reduce_scatter<Algo>(c, std::span<const T>(in, mine.size()), std::span(out, count), Op{});
  } else if constexpr (C == collective::all_gather) {
    all_gather<Algo>(c, std::span<const T>(in, count), std::span(out, out_n));
  } else if constexpr (C == collective::broadcast) {
    upload(out, r == root ? mine : std::vector<T>(count, T{}), s);
    broadcast<Algo>(c, std::span(out, count), root);
  } else if constexpr (C == collective::reduce) {
    reduce<Algo>(c, std::span<const T>(in, count), std::span(out, out_n), root, Op{});
  } else {
    all_to_all<Algo>(c, std::span<const T>(in, mine.size()), std::span(out, out_n));
  }
  const std::vector<T> got = download(out, out_n, s);
  const bool exact = pat == test::pattern::exact || std::is_integral_v<T>;
  const std::string diff = test::compare(got, want, exact, test::tolerance<T>(p));
  const auto what = [&] {
    return std::string(name_of(C)) + "<" + std::string(Algo::name) + "> " +
           std::string(dtype_traits<T>::name) + " " + std::string(op_name<Op>()) +
           " p=" + std::to_string(p) + " rank " + std::to_string(r) + " count " +
           std::to_string(count) + " root " + std::to_string(root) + (in_place ? " in place" : "") +
           (pat == test::pattern::random ? " random" : "");
  };
  EXPECT_TRUE(diff.empty()) << what() << ": " << diff;
  if (!in_place && C != collective::broadcast) {
    const std::vector<T> after = download(in, mine.size(), s);
    EXPECT_TRUE(mine.empty() ||
                std::memcmp(after.data(), mine.data(), mine.size() * sizeof(T)) == 0)
        << what() << ": the input changed";
  }
  return got;
}

/// The element types and operators of one (collective, count), each call checked as
/// call_and_check does: integers exact, floating types on random values within the reference's
/// tolerance. Where the collective reduces, every type with sum and avg (avg adds the plan's
/// division step, the part an algorithm could get wrong on its own), and with prod, min and max
/// too where EveryOperator (an operator only picks the reduce kernel, which kernels_test checks for
/// every type bit for bit); every type where it only moves data. An output every rank holds is
/// compared across the ranks bit for bit. All-reduces in place too.
template <class Algo, collective C, bool EveryOperator, class Comm>
void check_all_types(Comm& c, rank_memory& mem, shared_outputs& shared, std::size_t count,
                     int root) {
  const auto each = [&]<class T, class Op>(test::pattern pat) {
    auto out = call_and_check<Algo, C, T, Op>(c, mem, count, root, pat, false);
    if constexpr (replicates(C)) {
      expect_identical(c, shared, out,
                       std::string(name_of(C)) + "<" + std::string(Algo::name) + "> count " +
                           std::to_string(count));
    }
  };
  const auto each_op = [&]<class T>(test::pattern pat) {
    each.template operator()<T, op::sum>(pat);
    if constexpr (EveryOperator) {
      each.template operator()<T, op::prod>(pat);
      each.template operator()<T, op::min>(pat);
      each.template operator()<T, op::max>(pat);
    }
    each.template operator()<T, op::avg>(pat);
  };
  if constexpr (C == collective::all_reduce || C == collective::reduce_scatter ||
                C == collective::reduce) {
    each_op.template operator()<std::int32_t>(test::pattern::exact);
    each_op.template operator()<std::int64_t>(test::pattern::exact);
    each_op.template operator()<float>(test::pattern::random);
    each_op.template operator()<double>(test::pattern::random);
    each_op.template operator()<weft::half>(test::pattern::random);
    each_op.template operator()<weft::bfloat16>(test::pattern::random);
  } else {
    each.template operator()<std::int32_t, op::sum>(test::pattern::exact);
    each.template operator()<std::int64_t, op::sum>(test::pattern::random);
    each.template operator()<float, op::sum>(test::pattern::random);
    each.template operator()<double, op::sum>(test::pattern::random);
    each.template operator()<weft::half, op::sum>(test::pattern::random);
    each.template operator()<weft::bfloat16, op::sum>(test::pattern::random);
  }
  if constexpr (C == collective::all_reduce) {
    call_and_check<Algo, C, std::int64_t, op::sum>(c, mem, count, root, test::pattern::exact, true);
    call_and_check<Algo, C, float, op::sum>(c, mem, count, root, test::pattern::random, true);
    call_and_check<Algo, C, weft::bfloat16, op::avg>(c, mem, count, root, test::pattern::random,
                                                     true);
  }
}

/// Counts for p ranks: zero, one, fewer than the ranks, not divisible, 3001 (p2p: staged for
/// 4- and 2-byte all-reduces, two-shot for 8-byte ones), and one whose bytes exceed the staging
/// area for every type (the path past direct's one-shot; p2p's two-shot only).
inline std::vector<std::size_t> counts_for(int p) {
  const auto up = static_cast<std::size_t>(p);
  return {0, 1, up > 1 ? up - 1 : 2, up + 3, 3001, max_staged_scratch_bytes / 2 + 1};
}

// --- back-to-back calls, queued with no host synchronisation -------------------------------

/// Holds its stream back for about `cycles` clock ticks (a rank made late on purpose).
static __global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

/// x[i] += v * (i % 5 + 1): what each rank adds before each call of the sequence.
static __global__ void add_pattern(std::int64_t* x, std::size_t n, std::int64_t v) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v * static_cast<std::int64_t>(i % 5 + 1);
}

/// Every rank's data after `calls` rounds of: rank r adds the pattern of (r + k), then call k
/// is a sum all-reduce, or a broadcast from rank k % p where broadcast_at(k). All ranks start
/// from ones. The host model the back-to-back tests compare the device with.
template <class BroadcastAt>
std::vector<std::vector<std::int64_t>> back_to_back_model(int p, std::size_t n, int calls,
                                                          BroadcastAt broadcast_at) {
  std::vector<std::vector<std::int64_t>> model(static_cast<std::size_t>(p),
                                               std::vector<std::int64_t>(n, 1));
  for (int k = 0; k < calls; ++k) {
    for (int r = 0; r < p; ++r) {
      for (std::size_t i = 0; i < n; ++i)
        model[static_cast<std::size_t>(r)][i] += (r + k) * static_cast<std::int64_t>(i % 5 + 1);
    }
    if (broadcast_at(k)) {
      for (auto& m : model)
        m = model[static_cast<std::size_t>(k % p)];
    } else {
      std::vector<std::int64_t> sum(n, 0);
      for (const auto& m : model) {
        for (std::size_t i = 0; i < n; ++i)
          sum[i] += m[i];
      }
      for (auto& m : model)
        m = sum;
    }
  }
  return model;
}

} // namespace weft::test::device
