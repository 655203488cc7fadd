#pragma once
// Where a layer's work runs. A layer's GEMM policy decides it: cblas and reference_gemm work on
// host memory, cublas (<weft/layer/cuda/cublas.cuh>) on device memory and its stream. Everything
// else a layer does between its GEMMs (bias, GELU, copies, sums) is written once, as a
// WEFT_HOST_DEVICE functor of (row, column), and run here: in a loop on the host, or through the
// policy's `each_element` (found by argument-dependent lookup) as a kernel on its stream. So the
// host tests check the arithmetic the device runs (and, with a policy that visits the elements
// backwards, that no step depends on the order: tests/layer/reversed_elements.hpp).
//
//   using space = weft::layer::space_of<Gemm>;          // host_space or device_space
//   weft::matrix<T, space> h;                           // a layer's own buffers
//   detail::resize(gemm, h, tokens, cols);              // zero-filled, stream-ordered on a device
//   detail::for_each_element(gemm, y.rows(), y.cols(), detail::add_row<T>{y, b});
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/matrix.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace weft::layer {

namespace detail {
template <class G>
struct space_of_policy {
  using type = host_space;
};
template <class G>
requires requires { typename G::space; }
struct space_of_policy<G> {
  using type = typename G::space;
};
} // namespace detail

/// The memory a GEMM policy works on: G::space where it names one, else host_space.
template <class G>
using space_of = typename detail::space_of_policy<G>::type;

template <class G>
inline constexpr bool on_device = std::same_as<space_of<G>, device_space>;

/// The policy of host work that has no GEMM (an embedding's lookup, a block's residuals).
struct host_policy {};

namespace detail {

/// f(r, c) for every element of a rows x cols range, where the policy works: through the
/// policy's `each_element(policy, rows, cols, f)` where it has one (found by argument-dependent
/// lookup: cublas launches a kernel on its stream), else in a row-major loop on the host. f must
/// write only its own element, since a policy may visit them in any order.
template <class G, class F>
concept element_policy = requires(const G& g, std::size_t n, const F& f) {
  each_element(g, n, n, f);
};

template <class Gemm, class F>
void for_each_element(const Gemm& g, std::size_t rows, std::size_t cols, const F& f) {
  if constexpr (element_policy<Gemm, F>) {
    if (rows * cols != 0) each_element(g, rows, cols, f);
  } else {
    static_assert(!on_device<Gemm>,
                  "weft: a device policy must define each_element(policy, rows, cols, f)");
    (void)g;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        f(r, c);
  }
}

/// The sum of term(i) over i < n, in double, where the policy works: through the policy's
/// `sum_terms(policy, n, term)` where it has one (found by argument-dependent lookup: cublas adds
/// on the device, in parallel, in an order fixed by n, and returns once the stream has computed
/// it), else in order on the host. term is a WEFT_HOST_DEVICE functor of i returning a double.
template <class G, class F>
concept sum_policy = requires(const G& g, std::size_t n, const F& f) {
  { sum_terms(g, n, f) } -> std::convertible_to<double>;
};

template <class Gemm, class F>
[[nodiscard]] double sum_over(const Gemm& g, std::size_t n, const F& term) {
  if constexpr (sum_policy<Gemm, F>) {
    return sum_terms(g, n, term);
  } else {
    static_assert(!on_device<Gemm>, "weft: a device policy must define sum_terms(policy, n, term)");
    (void)g;
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      s += term(i);
    return s;
  }
}

/// Row-wise work in stages: stage k's f(r, c), for c in [0, cols_k), may read what stages before
/// it wrote for row r, and writes only what no other (r, c) of its stage touches. A policy with
/// `each_element` runs each stage over every row before the next (a kernel per stage: a row's
/// columns spread over threads); the host runs one row's stages after another, while the row is in
/// its cache. The same f(r, c) calls either way, so the same results.
template <class F>
struct row_stage {
  std::size_t cols;
  F f;
};
template <class F>
row_stage(std::size_t, F) -> row_stage<F>;

template <class Gemm, class... F>
void for_each_row_in_stages(const Gemm& g, std::size_t rows, const row_stage<F>&... stages) {
  if constexpr ((element_policy<Gemm, F> && ...)) {
    (for_each_element(g, rows, stages.cols, stages.f), ...);
  } else {
    static_assert(!on_device<Gemm>,
                  "weft: a device policy must define each_element(policy, rows, cols, f)");
    (void)g;
    const auto run = [](std::size_t r, const auto& stage) {
      for (std::size_t c = 0; c < stage.cols; ++c)
        stage.f(r, c);
    };
    for (std::size_t r = 0; r < rows; ++r)
      (run(r, stages), ...);
  }
}

/// A row reduction's lanes: lane l of row r takes the columns l, l + row_lanes, ... in order, and
/// the lanes are then combined in order. A device gives every (row, lane) its own thread, so a warp
/// reads one row's consecutive elements (one thread per row would read a row each, strided, and use
/// a few hundred threads); the host adds the same terms in the same order. Not always to the same
/// bit: nvcc contracts a multiply and an add into one fused, once-rounded FMA by default (and its
/// exp is not the host's), so device results agree with the host's to rounding, not bit for bit.
inline constexpr std::size_t row_lanes = 32;

/// A device policy must share its stream with the communicator, so that the layer's kernels,
/// GEMMs and collectives run in the order they are called; `who` names the layer in the error.
template <class Policy, class Comm>
void check_stream(std::string_view who, const Policy& policy, const Comm& tp) {
  if constexpr (on_device<Policy>) {
    static_assert(
        requires { tp.stream(); },
        "weft: a device policy (cublas) needs a device communicator (one with stream())");
    if (tp.stream() != policy.stream()) {
      throw error(std::string(who) +
                  ": the policy's stream is not the communicator's stream; "
                  "make the policy with the communicator's, e.g. cublas(comm.stream())");
    }
  } else {
    (void)who;
    (void)policy;
    (void)tp;
  }
}

/// m = rows x cols of zeros (stream-ordered on a device policy's stream).
template <class Gemm, class T, class Space>
void resize(const Gemm& g, matrix<T, Space>& m, std::size_t rows, std::size_t cols) {
  static_assert(std::same_as<Space, space_of<Gemm>>,
                "weft: a layer buffer in another memory space than its GEMM");
  if constexpr (on_device<Gemm>) {
    m.resize(rows, cols, g.stream());
  } else {
    (void)g;
    m.resize(rows, cols);
  }
}

/// m = rows x cols (zero-filled) unless it is that shape already (scratch whose every element is
/// written before it is read).
template <class Gemm, class T, class Space>
void reshape(const Gemm& g, matrix<T, Space>& m, std::size_t rows, std::size_t cols) {
  if (m.rows() != rows || m.cols() != cols) resize(g, m, rows, cols);
}

/// The sum of row r's lanes w * row_lanes + [0, row_lanes), in order.
template <class T>
WEFT_HOST_DEVICE T lane_total(matrix_view<const T> lanes, std::size_t r, std::size_t w = 0) {
  T s{};
  for (std::size_t l = 0; l < row_lanes; ++l)
    s += lanes(r, w * row_lanes + l);
  return s;
}

/// out(r, 0) = lane_total(lanes, r), as a row stage (r, 0).
template <class T>
struct lane_sum {
  matrix_view<const T> lanes;
  matrix_view<T> out;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    out(r, 0) = lane_total(lanes, r);
  }
};

/// Causal attention's scores come as square blocks (seq x seq) stacked one under another, a block
/// per (sequence, head): row r of the stack is row r % seq of its block, whose causal part is the
/// columns 0 ..= r % seq. (A single block is the stack of one: r % seq = r.)
[[nodiscard]] WEFT_HOST_DEVICE constexpr std::size_t causal_last(std::size_t r,
                                                                 std::size_t seq) noexcept {
  return r % seq;
}

/// lanes(r, l) = the largest of x(r, c) over lane l's columns c < the row's end (lowest where
/// there is none), as a row stage (r, l); the end is x.cols(), or, where causal (a stack of
/// causal attention's score blocks), causal_last(r, x.cols()) + 1.
template <class T>
struct lane_maxima {
  matrix_view<const T> x;
  matrix_view<T> lanes;
  T lowest;
  bool causal = false;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    const std::size_t end = causal ? causal_last(r, x.cols()) + 1 : x.cols();
    T m = lowest;
    for (std::size_t c = l; c < end; c += row_lanes)
      m = x(r, c) > m ? x(r, c) : m;
    lanes(r, l) = m;
  }
};

/// out(r, 0) = the largest of row r's lanes [0, row_lanes), as a row stage (r, 0).
template <class T>
struct lane_maximum {
  matrix_view<const T> lanes;
  matrix_view<T> out;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    T m = lanes(r, 0);
    for (std::size_t l = 1; l < row_lanes; ++l)
      m = lanes(r, l) > m ? lanes(r, l) : m;
    out(r, 0) = m;
  }
};

/// Scratch for a row reduction: `ways` partials per lane and `ways` results per row (reshaped, so
/// reallocated only when the rows or ways change).
template <class T, class Space>
struct row_scratch {
  matrix<T, Space> lanes;   // rows x (ways * row_lanes)
  matrix<T, Space> results; // rows x ways

  /// Lanes for `ways` sums of each of `rows` rows, and `per_row` results of each (default: ways).
  /// Unchanged shapes keep their memory and contents; a layer reserves one shape for all its calls.
  template <class Gemm>
  void reserve(const Gemm& g, std::size_t rows, std::size_t ways, std::size_t per_row) {
    reshape(g, lanes, rows, ways * row_lanes);
    reshape(g, results, rows, per_row);
  }
  template <class Gemm>
  void reserve(const Gemm& g, std::size_t rows, std::size_t ways) {
    reserve(g, rows, ways, ways);
  }
  void release() {
    lanes = {};
    results = {};
  }
};

/// Sums over rows by lanes, the transpose of a row reduction's: lane l of column c sums the rows
/// l, l + row_lanes, ... in order, and the lanes are then added in order. A device gives every
/// (lane, column) its own thread (a warp reads consecutive columns of one row, with 32 times the
/// threads of one per column); the host adds row after row into lane r % row_lanes, the same terms
/// in the same order (to rounding on a device: see row_lanes). Sums is a WEFT_HOST_DEVICE
/// functor type with
///   lanes        a matrix_view<double>, row_lanes x (ways x columns): its partial sums,
///   lane(l, c)   lane l's sums of column c, written to lanes (a device thread's work),
///   add(r, c)    row r's terms of column c added to lanes(r % row_lanes, ...) (the host's),
///   combine(c)   the lanes of column c added in order, into the result.
template <class Sums>
struct column_lane_stage {
  Sums sums;
  WEFT_HOST_DEVICE void operator()(std::size_t l, std::size_t c) const { sums.lane(l, c); }
};
template <class Sums>
struct column_combine_stage {
  Sums sums;
  WEFT_HOST_DEVICE void operator()(std::size_t, std::size_t c) const { sums.combine(c); }
};

template <class Gemm, class Sums>
void sum_rows_by_lanes(const Gemm& g, std::size_t rows, std::size_t cols, const Sums& sums) {
  if constexpr (element_policy<Gemm, column_lane_stage<Sums>> &&
                element_policy<Gemm, column_combine_stage<Sums>>) {
    for_each_element(g, row_lanes, cols, column_lane_stage<Sums>{sums});
    for_each_element(g, 1, cols, column_combine_stage<Sums>{sums});
  } else { // row by row, for the cache
    static_assert(!on_device<Gemm>,
                  "weft: a device policy must define each_element(policy, rows, cols, f)");
    (void)g;
    for (std::size_t l = 0; l < row_lanes; ++l)
      for (std::size_t i = 0; i < sums.lanes.cols(); ++i)
        sums.lanes(l, i) = 0.0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        sums.add(r, c);
    for (std::size_t c = 0; c < cols; ++c)
      sums.combine(c);
  }
}

/// db(0, c) += the sum of dy(:, c), by lanes (sum_rows_by_lanes), in double.
template <class T>
struct column_sums {
  matrix_view<const T> dy;
  matrix_view<T> db;
  matrix_view<double> lanes; // row_lanes x dy.cols()
  WEFT_HOST_DEVICE void lane(std::size_t l, std::size_t c) const {
    double s = 0.0;
    for (std::size_t r = l; r < dy.rows(); r += row_lanes)
      s += static_cast<double>(dy(r, c));
    lanes(l, c) = s;
  }
  WEFT_HOST_DEVICE void add(std::size_t r, std::size_t c) const {
    lanes(r % row_lanes, c) += static_cast<double>(dy(r, c));
  }
  WEFT_HOST_DEVICE void combine(std::size_t c) const {
    double s = 0.0;
    for (std::size_t l = 0; l < row_lanes; ++l)
      s += lanes(l, c);
    db(0, c) += static_cast<T>(s);
  }
};

/// Any owning matrix's elements as one span (device memory for a device matrix: for collectives).
template <class T, class Space>
[[nodiscard]] std::span<T> flat_of(matrix<T, Space>& m) noexcept {
  return {m.data(), m.size()};
}

template <class T>
struct copy_element {
  matrix_view<const T> src;
  matrix_view<T> dst;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { dst(r, c) = src(r, c); }
};

template <class T>
struct fill_element {
  matrix_view<T> m;
  T v;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { m(r, c) = v; }
};

template <class T>
struct zero_element {
  matrix_view<T> m;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { m(r, c) = T{}; }
};

/// y(r, :) += b(0, :).
template <class T>
struct add_row {
  matrix_view<T> y;
  matrix_view<const T> b;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { y(r, c) += b(0, c); }
};

/// y(r, c) += x(r, c) (a residual connection).
template <class T>
struct add_element {
  matrix_view<T> y;
  matrix_view<const T> x;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { y(r, c) += x(r, c); }
};

/// dst = src, same shape, any leading dimensions.
template <class Gemm, class T>
void copy_view(const Gemm& g, matrix_view<const T> src, matrix_view<T> dst) {
  for_each_element(g, src.rows(), src.cols(), copy_element<T>{src, dst});
}

template <class Gemm, class T, class Space>
void zero(const Gemm& g, matrix<T, Space>& m) {
  for_each_element(g, m.rows(), m.cols(), zero_element<T>{m.view()});
}

} // namespace detail

} // namespace weft::layer
