#pragma once
// Runs the public collective operations on the local transport and compares every rank's
// result with the independent serial reference of tests/support/reference.hpp. Each test
// file instantiates these once per algorithm policy (typed tests), so one check serves
// every algorithm and, later, every transport.
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include "support/reference.hpp"
#include "support/scale.hpp"

namespace weft::test {

/// World sizes every collective is checked on.
inline const std::vector<int> world_sizes = sanitized
                                                ? std::vector<int>{1, 2, 3, 5, 8, 16}
                                                : std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

/// Element counts for p ranks: zero, one, fewer than the ranks, not divisible, a few thousand.
inline std::vector<std::size_t> counts_for(int p) {
  const auto up = static_cast<std::size_t>(p);
  if (sanitized) return {0, 1, up + 3, 301};
  return {0, 1, up > 1 ? up - 1 : 2, up + 3, 3001};
}

/// What the ranks of one run saw, gathered to compare them with each other.
template <class T>
struct shared_outputs {
  explicit shared_outputs(int p) : outputs(static_cast<std::size_t>(p)) {}
  std::vector<std::vector<T>> outputs;
};

/// Reference rows that every rank of a local world expects alike (all_reduce, all_gather,
/// broadcast), computed once per call by the first rank to reach it and read by the others.
/// The ranks make the same sequence of calls: the k-th call of each rank reads the k-th row.
/// A rank whose k-th call differs from the first one's computes its own row.
class shared_rows {
public:
  explicit shared_rows(int p) : p_(p), next_(static_cast<std::size_t>(p), 0) {}

  template <class T, class Make>
  std::shared_ptr<const std::vector<T>> get(int rank, const std::string& key, const Make& make) {
    const std::lock_guard lock(mutex_);
    const std::size_t k = next_[static_cast<std::size_t>(rank)]++;
    auto& e = rows_[k];
    if (!e.row) {
      e.key = key;
      e.row = std::make_shared<const std::vector<T>>(make());
    }
    auto row = e.key == key ? std::static_pointer_cast<const std::vector<T>>(e.row)
                            : std::make_shared<const std::vector<T>>(make());
    if (++e.taken == p_) rows_.erase(k);
    return row;
  }

private:
  struct entry {
    std::string key;
    std::shared_ptr<const void> row;
    int taken = 0;
  };
  int p_;
  std::mutex mutex_;
  std::vector<std::size_t> next_;
  std::map<std::size_t, entry> rows_;
};

/// One call of collective C with algorithm Algo on rank c, checked against the reference.
/// Returns the rank's output. `pat` chooses exact integers or random values. With `rows`, the
/// ranks of a local world share the reference rows they expect alike.
template <class Algo, collective C, class T, class Op, class Comm>
std::vector<T> call_and_check(Comm& c, std::size_t count, int root, pattern pat, bool in_place,
                              std::uint64_t seed = 1, shared_rows* rows = nullptr) {
  const int p = c.size();
  const int r = c.rank();
  // This rank's input, and its reference row from the inputs of the ranks it depends on,
  // generated element by element where the row reads them.
  std::vector<T> in;
  in.reserve(input_count(C, p, count));
  for (std::size_t i = 0; i < input_count(C, p, count); ++i)
    in.push_back(input_value<T, Op>(r, i, pat, seed));
  const auto make_want = [&] {
    return reference_row<T, Op>(C, p, count, root, r, [&](int s, std::size_t i) {
      return s == r ? in[i] : input_value<T, Op>(s, i, pat, seed);
    });
  };
  constexpr bool alike =
      C == collective::all_reduce || C == collective::all_gather || C == collective::broadcast;
  const auto shared_want =
      alike && rows != nullptr
          ? rows->get<T>(r,
                         std::string(name_of(C)) + typeid(T).name() + typeid(Op).name() + " " +
                             std::to_string(p) + " " + std::to_string(count) + " " +
                             std::to_string(root) + " " + std::to_string(static_cast<int>(pat)) +
                             " " + std::to_string(seed),
                         make_want)
          : std::make_shared<const std::vector<T>>(make_want());
  const std::vector<T>& want = *shared_want;
  std::vector<T> out(output_count(C, p, count, r, root), T{});
  if constexpr (C == collective::all_reduce) {
    if (in_place) {
      all_reduce<Algo>(c, std::span(in), Op{});
      out = in;
    } else {
      all_reduce<Algo>(c, std::span<const T>(in), std::span(out), Op{});
    }
  } else if constexpr (C == collective::reduce_scatter) {
    reduce_scatter<Algo>(c, std::span<const T>(in), std::span(out), Op{});
  } else if constexpr (C == collective::all_gather) {
    all_gather<Algo>(c, std::span<const T>(in), std::span(out));
  } else if constexpr (C == collective::broadcast) {
    out = r == root ? in : std::vector<T>(count, T{});
    broadcast<Algo>(c, std::span(out), root);
  } else if constexpr (C == collective::reduce) {
    reduce<Algo>(c, std::span<const T>(in), std::span(out), root, Op{});
  } else {
    all_to_all<Algo>(c, std::span<const T>(in), std::span(out));
  }
  const bool exact = pat == pattern::exact || std::is_integral_v<T>;
  const std::string diff = compare(out, want, exact, tolerance<T>(p));
  EXPECT_TRUE(diff.empty()) << name_of(C) << "<" << Algo::name << "> " << dtype_traits<T>::name
                            << " " << op_name<Op>() << " p=" << p << " rank " << r << " count "
                            << count << " root " << root << (in_place ? " in place" : "")
                            << (pat == pattern::random ? " random" : "") << ": " << diff;
  return out;
}

/// Checks that every rank's output is bitwise identical to rank 0's.
template <class T, class Comm>
void expect_identical(Comm& c, shared_outputs<T>& shared, std::vector<T> mine,
                      const std::string& what) {
  shared.outputs[static_cast<std::size_t>(c.rank())] = std::move(mine);
  c.barrier();
  if (c.rank() != 0) {
    const auto& a = shared.outputs[0];
    const auto& b = shared.outputs[static_cast<std::size_t>(c.rank())];
    bool same = a.size() == b.size();
    for (std::size_t i = 0; same && i < a.size(); ++i)
      same = same_bits(a[i], b[i]);
    EXPECT_TRUE(same) << what << ": rank " << c.rank() << " differs from rank 0";
  }
  c.barrier();
}

/// Every (type, op) case a collective is checked with: exact patterns for all types and
/// ops, random values for the floating types.
template <class Algo, collective C, class Comm>
void check_all_types(Comm& c, std::size_t count, int root, shared_rows* rows = nullptr) {
  const auto each = [&]<class T, class Op>(pattern pat) {
    if constexpr (C == collective::all_reduce) {
      call_and_check<Algo, C, T, Op>(c, count, root, pat, true, 1, rows);
    }
    call_and_check<Algo, C, T, Op>(c, count, root, pat, false, 1, rows);
  };
  each.template operator()<std::int32_t, op::sum>(pattern::exact);
  each.template operator()<std::int64_t, op::prod>(pattern::exact);
  if constexpr (sanitized) {
    each.template operator()<float, op::sum>(pattern::random);
    each.template operator()<half, op::sum>(pattern::exact);
    return;
  }
  each.template operator()<float, op::sum>(pattern::exact);
  each.template operator()<double, op::sum>(pattern::random);
  if constexpr (C != collective::all_gather && C != collective::broadcast &&
                C != collective::all_to_all) {
    // Data movement alone does not depend on the operator; reductions are checked with each.
    each.template operator()<std::int32_t, op::min>(pattern::exact);
    each.template operator()<std::int32_t, op::max>(pattern::random);
    each.template operator()<std::int32_t, op::avg>(pattern::exact);
    each.template operator()<float, op::max>(pattern::random);
    each.template operator()<float, op::sum>(pattern::random);
    each.template operator()<double, op::prod>(pattern::exact);
    each.template operator()<float, op::avg>(pattern::random);
    each.template operator()<half, op::sum>(pattern::exact);
    each.template operator()<bfloat16, op::sum>(pattern::exact);
    each.template operator()<half, op::min>(pattern::random);
  } else {
    each.template operator()<half, op::sum>(pattern::exact);
    each.template operator()<bfloat16, op::sum>(pattern::random);
  }
}

/// The standard sweep: every world size, every count, root p-1 and 0.
/// Deadline for the ranks of a test: long enough for a sanitizer build, short enough that a
/// broken plan fails the test instead of stalling it.
inline const local::options test_options{.timeout = std::chrono::seconds(60)};

template <class Algo, collective C>
void sweep() {
  for (int p : world_sizes) {
    shared_outputs<float> shared(p);
    shared_rows rows(p);
    local::run(
        p,
        [&](local::communicator& c) {
          for (std::size_t count : counts_for(p))
            check_all_types<Algo, C>(c, count, p - 1, &rows);
          if (C == collective::broadcast || C == collective::reduce) {
            for (int root = 0; root < p - 1; ++root)
              call_and_check<Algo, C, std::int32_t, op::sum>(c, 7, root, pattern::exact, false, 1,
                                                             &rows);
          }
          if (C == collective::all_reduce || C == collective::all_gather ||
              C == collective::broadcast) {
            auto mine = call_and_check<Algo, C, float, op::sum>(c, 2049, 0, pattern::random, false,
                                                                1, &rows);
            expect_identical(c, shared, std::move(mine),
                             std::string(name_of(C)) + "<" + std::string(Algo::name) + ">");
          }
        },
        test_options);
    if (::testing::Test::HasFailure()) return;
  }
}

/// Several MiB on a few world sizes, float random (within tolerance, identical on all
/// ranks where the collective replicates) and int exact.
template <class Algo, collective C>
void large(std::size_t count) {
  count = scaled(count, 4096);
  for (int p : {4, 7}) {
    shared_outputs<float> shared(p);
    shared_rows rows(p);
    local::run(
        p,
        [&](local::communicator& c) {
          auto mine = call_and_check<Algo, C, float, op::sum>(c, count, p / 2, pattern::random,
                                                              false, 1, &rows);
          if (C == collective::all_reduce || C == collective::all_gather ||
              C == collective::broadcast) {
            expect_identical(c, shared, std::move(mine), "large");
          }
          call_and_check<Algo, C, std::int32_t, op::sum>(c, count, 0, pattern::exact,
                                                         C == collective::all_reduce, 1, &rows);
        },
        test_options);
  }
}

} // namespace weft::test
