#pragma once
// Independent serial references for the collectives, input patterns in the manner of
// nccl-tests (values whose reductions are exact in any order), and a checker that runs an
// algorithm's plans for every rank on the serial model. Nothing here calls weft's kernels:
// the references are plain loops in double or in the integer type.
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/detail/serial_model.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace weft::test {

enum class pattern { exact, random };

/// Input element i of rank r for operator Op. Exact patterns are small integers whose
/// sums, products, minima and maxima are exact in every type and every order.
template <class T, class Op>
T input_value(int r, std::size_t i, pattern pat, std::uint64_t seed = 1) {
  if (pat == pattern::random) {
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(r) << 40) ^ i;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<std::int64_t>(x % 2001) - 1000);
    } else {
      const double u = static_cast<double>(x >> 11) * 0x1.0p-53; // [0, 1)
      if constexpr (std::is_base_of_v<op::prod, Op>) return static_cast<T>(0.5 + u);
      return static_cast<T>(2.0 * u - 1.0);
    }
  }
  const std::size_t h = (static_cast<std::size_t>(r) * 7 + i * 13) % 11;
  if constexpr (std::is_base_of_v<op::prod, Op>) {
    return static_cast<T>(h % 3 == 0 ? -1 : 1);
  } else if constexpr (std::is_base_of_v<op::min, Op> || std::is_base_of_v<op::max, Op>) {
    return static_cast<T>(static_cast<int>(h) - 5);
  } else {
    return static_cast<T>(static_cast<int>(h) - 3);
  }
}

template <class Op>
double ref_combine(double a, double b) {
  if constexpr (std::is_base_of_v<op::prod, Op>)
    return a * b;
  else if constexpr (std::is_base_of_v<op::min, Op>)
    return b < a ? b : a;
  else if constexpr (std::is_base_of_v<op::max, Op>)
    return a < b ? b : a;
  else
    return a + b;
}

/// Expected output of rank `rank` (empty where its output is unspecified). `in(s, i)` is
/// element i of rank s's input; the row reads only the elements it depends on.
template <class T, class Op, class Input>
std::vector<T> reference_row(collective c, int p, std::size_t count, int root, int rank,
                             const Input& in) {
  std::vector<T> o;
  const auto reduce_at = [&](std::size_t idx) {
    if constexpr (std::is_integral_v<T>) {
      // Integer sums and products wrap modulo 2^bits, as in NCCL and MPI implementations.
      using U = std::make_unsigned_t<T>;
      T acc = in(0, idx);
      for (int r = 1; r < p; ++r) {
        T v = in(r, idx);
        if constexpr (std::is_base_of_v<op::prod, Op>)
          acc = static_cast<T>(static_cast<U>(acc) * static_cast<U>(v));
        else if constexpr (std::is_base_of_v<op::min, Op>)
          acc = v < acc ? v : acc;
        else if constexpr (std::is_base_of_v<op::max, Op>)
          acc = acc < v ? v : acc;
        else
          acc = static_cast<T>(static_cast<U>(acc) + static_cast<U>(v));
      }
      if constexpr (is_average_v<Op>) acc = static_cast<T>(acc / p);
      return acc;
    } else {
      const T first = in(0, idx);
      double acc = static_cast<double>(static_cast<float>(first));
      if constexpr (std::is_same_v<T, double>) acc = first;
      for (int r = 1; r < p; ++r) {
        const T v = in(r, idx);
        double dv = std::is_same_v<T, double> ? static_cast<double>(v)
                                              : static_cast<double>(static_cast<float>(v));
        acc = ref_combine<Op>(acc, dv);
      }
      if constexpr (is_average_v<Op>) acc /= p;
      return static_cast<T>(acc);
    }
  };
  switch (c) {
    case collective::all_reduce:
      o.reserve(count);
      for (std::size_t i = 0; i < count; ++i)
        o.push_back(reduce_at(i));
      break;
    case collective::reduce:
      if (rank == root) {
        o.reserve(count);
        for (std::size_t i = 0; i < count; ++i)
          o.push_back(reduce_at(i));
      }
      break;
    case collective::reduce_scatter:
      o.reserve(count);
      for (std::size_t i = 0; i < count; ++i)
        o.push_back(reduce_at(static_cast<std::size_t>(rank) * count + i));
      break;
    case collective::all_gather:
      o.reserve(count * static_cast<std::size_t>(p));
      for (int s = 0; s < p; ++s) {
        for (std::size_t i = 0; i < count; ++i)
          o.push_back(in(s, i));
      }
      break;
    case collective::broadcast:
      o.reserve(count);
      for (std::size_t i = 0; i < count; ++i)
        o.push_back(in(root, i));
      break;
    case collective::all_to_all:
      o.reserve(count * static_cast<std::size_t>(p));
      for (int s = 0; s < p; ++s) {
        for (std::size_t i = 0; i < count; ++i)
          o.push_back(in(s, static_cast<std::size_t>(rank) * count + i));
      }
      break;
  }
  return o;
}

/// Expected outputs of every rank (empty where a rank's output is unspecified).
template <class T, class Op>
std::vector<std::vector<T>> reference(collective c, int p, std::size_t count, int root,
                                      const std::vector<std::vector<T>>& in) {
  std::vector<std::vector<T>> out(static_cast<std::size_t>(p));
  const auto at = [&](int s, std::size_t i) -> const T& {
    return in[static_cast<std::size_t>(s)][i];
  };
  for (int r = 0; r < p; ++r)
    out[static_cast<std::size_t>(r)] = reference_row<T, Op>(c, p, count, root, r, at);
  return out;
}

inline std::size_t input_count(collective c, int p, std::size_t count) {
  return c == collective::reduce_scatter || c == collective::all_to_all
             ? count * static_cast<std::size_t>(p)
             : count;
}
inline std::size_t output_count(collective c, int p, std::size_t count, int rank, int root) {
  switch (c) {
    case collective::all_gather:
    case collective::all_to_all: return count * static_cast<std::size_t>(p);
    case collective::reduce: return rank == root ? count : 0;
    default: return count;
  }
}

/// Bitwise equality of two values (so -0 != +0 and NaN == NaN of the same payload).
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Compares got with want: exact for integers and exact patterns, else within rel_tol of the
/// magnitude of the data. Returns an empty string or the first mismatch, described.
template <class T>
std::string compare(const std::vector<T>& got, const std::vector<T>& want, bool exact, double tol) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(
        static_cast<std::conditional_t<std::is_same_v<T, double>, double,
                                       std::conditional_t<std::is_integral_v<T>, T, float>>>(
            got[i]));
    const double w = static_cast<double>(
        static_cast<std::conditional_t<std::is_same_v<T, double>, double,
                                       std::conditional_t<std::is_integral_v<T>, T, float>>>(
            want[i]));
    const bool ok = exact ? g == w : std::abs(g - w) <= tol * (1.0 + std::abs(w));
    if (!ok)
      return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " +
             std::to_string(w);
  }
  return {};
}

/// Tolerance for random float inputs on p ranks: a few rounding errors of T per addition.
template <class T>
double tolerance(int p) {
  if constexpr (std::is_same_v<T, double>)
    return 1e-13 * p;
  else if constexpr (std::is_same_v<T, float>)
    return 1e-5 * p;
  else if constexpr (std::is_same_v<T, half>)
    return 2e-3 * p;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return 1.6e-2 * p;
  else
    return 0;
}

/// Runs the plans of every rank (plans[r] is rank r's, for collective c of count elements
/// from root) on the serial model, in place (where the collective allows) and out of place,
/// under the interleavings of `seeds`; checks every rank against the reference and, where all
/// ranks hold the same result, that they are bitwise identical.
template <class T, class Op = op::sum>
void check_plan_set(const std::vector<plan>& plans, collective c, std::size_t count, int root,
                    pattern pat, std::initializer_list<std::uint64_t> seeds) {
  const int p = static_cast<int>(plans.size());
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < input_count(c, p, count); ++i) {
      in[static_cast<std::size_t>(r)].push_back(input_value<T, Op>(r, i, pat));
    }
  }
  if (c == collective::broadcast) {
    for (int r = 0; r < p; ++r) {
      if (r != root) in[static_cast<std::size_t>(r)].assign(count, T{});
    }
  }
  const auto want = reference<T, Op>(c, p, count, root, in);
  const bool exact = pat == pattern::exact || std::is_integral_v<T>;
  const bool can_in_place = c == collective::all_reduce || c == collective::broadcast;
  for (int in_place = 0; in_place < (can_in_place ? 2 : 1); ++in_place) {
    for (std::uint64_t seed : seeds) {
      std::vector<detail::model_rank<T>> ranks(static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r) {
        auto& rk = ranks[static_cast<std::size_t>(r)];
        rk.in_place = in_place != 0 || c == collective::broadcast;
        rk.input = in[static_cast<std::size_t>(r)];
        rk.output.assign(output_count(c, p, count, r, root), T{});
        if (rk.in_place) rk.output = in[static_cast<std::size_t>(r)];
        if (c == collective::broadcast) rk.in_place = true;
      }
      ASSERT_NO_THROW(detail::run_serial(plans, ranks, Op{}, seed)) << plans[0].to_string();
      for (int r = 0; r < p; ++r) {
        auto got = ranks[static_cast<std::size_t>(r)].output;
        if (c == collective::reduce && r != root) continue;
        if constexpr (is_average_v<Op>) {
          if (c == collective::all_reduce || c == collective::reduce_scatter ||
              c == collective::reduce) {
            // The plan sums; the operation divides afterwards. Do it as the operation does.
            using A = accumulate_t<T>;
            for (auto& v : got)
              v = static_cast<T>(static_cast<A>(v) / static_cast<A>(p));
          }
        }
        const std::string diff =
            compare(got, want[static_cast<std::size_t>(r)], exact, tolerance<T>(p));
        ASSERT_TRUE(diff.empty()) << "rank " << r << (in_place ? " in place" : "") << " seed "
                                  << seed << ": " << diff << "\n"
                                  << plans[static_cast<std::size_t>(r)].to_string();
      }
      if (c == collective::all_reduce || c == collective::all_gather ||
          c == collective::broadcast) {
        for (int r = 1; r < p; ++r) {
          const auto& a = ranks[0].output;
          const auto& b = ranks[static_cast<std::size_t>(r)].output;
          for (std::size_t i = 0; i < a.size(); ++i) {
            ASSERT_TRUE(same_bits(a[i], b[i])) << "rank " << r << " differs from rank 0 at " << i;
          }
        }
      }
    }
  }
}

/// Builds Algo's plans for every rank and checks them as check_plan_set does, under two
/// interleavings.
template <class Algo, class T, class Op = op::sum>
void check_plans(collective c, int p, std::size_t count, int root = 0, pattern pat = pattern::exact,
                 std::vector<int> node_of = {}) {
  SCOPED_TRACE(std::string(Algo::name) + " " + std::string(name_of(c)) + " " +
               std::string(dtype_traits<T>::name) + " " + std::string(op_name<Op>()) +
               " p=" + std::to_string(p) + " count=" + std::to_string(count) +
               " root=" + std::to_string(root) + (pat == pattern::random ? " random" : " exact"));
  std::vector<plan> plans;
  for (int r = 0; r < p; ++r) {
    plan_request req{c, p, r, count, root, node_of};
    plans.push_back(Algo::make_plan(req));
  }
  check_plan_set<T, Op>(plans, c, count, root, pat, {0, 7});
}

} // namespace weft::test
