#pragma once
// The layers' only tensor type: a row-major matrix view (rows, cols, leading dimension) over
// host or device memory, and an owning host matrix. Not a tensor library: a batch of tokens is
// a matrix of rows x hidden, a weight is out x in, and that is all the layers need.
//
//   weft::matrix<float> w(out, in);                  // zero-filled, owning, host memory
//   weft::matrix_view<float> top = w.view().rows_from(0, out / 2);
//   weft::matrix_view<const float> cw = w;           // views convert to const views
//
// The element (r, c) of a view lives at data()[r * ld() + c]. Device memory (weft::device_space)
// has its owning matrix in <weft/layer/cuda/matrix.cuh>; views do not care where the data is, but
// only host views may be indexed on the host.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft {

/// Where a matrix's memory lives.
struct host_space {};
struct device_space {};

template <class T>
class matrix_view {
public:
  using value_type = std::remove_const_t<T>;

  constexpr matrix_view() = default;
  WEFT_HOST_DEVICE constexpr matrix_view(T* data, std::size_t rows, std::size_t cols,
                                         std::size_t ld)
      : data_(data), rows_(rows), cols_(cols), ld_(ld) {}
  WEFT_HOST_DEVICE constexpr matrix_view(T* data, std::size_t rows, std::size_t cols)
      : matrix_view(data, rows, cols, cols) {}

  /// A mutable view converts to a const one.
  template <class U>
  requires(std::is_const_v<T>&& std::same_as<const U, T>)
      WEFT_HOST_DEVICE constexpr matrix_view(matrix_view<U> v)
      : matrix_view(v.data(), v.rows(), v.cols(), v.ld()) {}

  [[nodiscard]] WEFT_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] WEFT_HOST_DEVICE constexpr std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] WEFT_HOST_DEVICE constexpr std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] WEFT_HOST_DEVICE constexpr std::size_t ld() const noexcept { return ld_; }
  [[nodiscard]] WEFT_HOST_DEVICE constexpr std::size_t size() const noexcept {
    return rows_ * cols_;
  }
  [[nodiscard]] WEFT_HOST_DEVICE constexpr bool contiguous() const noexcept {
    return ld_ == cols_ || rows_ <= 1;
  }

  [[nodiscard]] WEFT_HOST_DEVICE constexpr T& operator()(std::size_t r,
                                                         std::size_t c) const noexcept {
    return data_[r * ld_ + c];
  }
  /// Row r as a span (host memory only, if it is to be read).
  [[nodiscard]] constexpr std::span<T> row(std::size_t r) const noexcept {
    return {data_ + r * ld_, cols_};
  }
  /// All elements as one span; the view must be contiguous.
  [[nodiscard]] std::span<T> flat() const {
    if (!contiguous())
      throw error("matrix_view::flat: the view is not contiguous (ld " + std::to_string(ld_) +
                  " > cols " + std::to_string(cols_) + ")");
    return {data_, size()};
  }

  /// Rows [first, first + count) / columns [first, first + count), as views into the same memory.
  [[nodiscard]] matrix_view rows_from(std::size_t first, std::size_t count) const {
    if (first + count > rows_)
      throw error("matrix_view::rows_from: rows [" + std::to_string(first) + ", " +
                  std::to_string(first + count) + ") of " + std::to_string(rows_));
    return {at(first * ld_), count, cols_, ld_};
  }
  [[nodiscard]] matrix_view cols_from(std::size_t first, std::size_t count) const {
    if (first + count > cols_)
      throw error("matrix_view::cols_from: columns [" + std::to_string(first) + ", " +
                  std::to_string(first + count) + ") of " + std::to_string(cols_));
    return {at(first), rows_, count, ld_};
  }
  /// The same shape `offset` elements further on (an empty matrix's null data stays null: C++
  /// leaves an offset applied to a null pointer undefined, and UBSan says so).
  [[nodiscard]] WEFT_HOST_DEVICE constexpr matrix_view shifted(std::size_t offset) const noexcept {
    return {at(offset), rows_, cols_, ld_};
  }

private:
  [[nodiscard]] WEFT_HOST_DEVICE constexpr T* at(std::size_t offset) const noexcept {
    return data_ == nullptr ? data_ : data_ + offset;
  }

  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t ld_ = 0;
};

template <class T>
matrix_view(T*, std::size_t, std::size_t) -> matrix_view<T>;
template <class T>
matrix_view(T*, std::size_t, std::size_t, std::size_t) -> matrix_view<T>;

/// An owning matrix; host_space here, device_space in <weft/layer/cuda/matrix.cuh>.
template <class T, class Space = host_space>
class matrix;

namespace detail {

/// Bytes of host matrices held now and at most, for an allocation account: a trainer points
/// this thread's host_matrix_bytes at its tally while it builds and runs its layers, and every
/// host matrix allocated meanwhile is charged to it until freed (from any thread), also after
/// it moves. A stash moved out of the layers can be taken off (take) and put back (give).
struct byte_tally { // held by shared_ptr: a matrix may outlive the trainer that charged it
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};
  void give(std::int64_t n) noexcept {
    const std::int64_t now = current.fetch_add(n) + n;
    std::int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void take(std::int64_t n) noexcept { current.fetch_sub(n); }
  /// Starts a new peak from what is held now.
  void reset_peak() noexcept { peak.store(current.load()); }
};
inline thread_local std::shared_ptr<byte_tally> host_matrix_bytes = nullptr;

/// Makes `t` this thread's tally while in scope (the previous one after).
class tally_scope {
public:
  explicit tally_scope(std::shared_ptr<byte_tally> t) noexcept
      : previous_(std::exchange(host_matrix_bytes, std::move(t))) {}
  tally_scope(const tally_scope&) = delete;
  tally_scope& operator=(const tally_scope&) = delete;
  ~tally_scope() { host_matrix_bytes = std::move(previous_); }

private:
  std::shared_ptr<byte_tally> previous_;
};

/// std::allocator that charges its allocations to the tally current where it was made.
template <class T>
struct tallied_allocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  std::shared_ptr<byte_tally> tally = host_matrix_bytes;

  tallied_allocator() noexcept = default;
  template <class U>
  tallied_allocator(const tallied_allocator<U>& o) noexcept : tally(o.tally) {} // NOLINT: rebinding
  [[nodiscard]] T* allocate(std::size_t n) {
    T* p = std::allocator<T>{}.allocate(n);
    if (tally != nullptr) tally->give(static_cast<std::int64_t>(n * sizeof(T)));
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (tally != nullptr) tally->take(static_cast<std::int64_t>(n * sizeof(T)));
    std::allocator<T>{}.deallocate(p, n);
  }
  /// A copied matrix is charged where it is copied.
  [[nodiscard]] tallied_allocator select_on_container_copy_construction() const noexcept {
    return {};
  }
  template <class U>
  friend bool operator==(const tallied_allocator& a, const tallied_allocator<U>& b) noexcept {
    return a.tally == b.tally;
  }
};

/// A host vector charged like a matrix (a layer's kept token ids, say).
template <class T>
using tallied_vector = std::vector<T, tallied_allocator<T>>;

} // namespace detail

template <class T>
class matrix<T, host_space> {
public:
  using value_type = T;
  using space = host_space;

  matrix() = default;
  matrix(std::size_t rows, std::size_t cols, T fill = T{})
      : rows_(rows), cols_(cols), data_(rows * cols, fill), ptr_(data_.data()) {}
  /// A copy owns its elements, also when `other` is bound (bind) to memory it does not own; a
  /// copy of one bound to nothing is bound to nothing.
  matrix(const matrix& other) : rows_(other.rows_), cols_(other.cols_) {
    if (other.ptr_ == nullptr) {
      bound_ = other.bound_;
      return;
    }
    data_.assign(other.ptr_, other.ptr_ + other.size());
    ptr_ = data_.data();
  }
  matrix(matrix&& other) noexcept
      : rows_(std::exchange(other.rows_, 0)),
        cols_(std::exchange(other.cols_, 0)),
        data_(std::move(other.data_)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        bound_(std::exchange(other.bound_, false)) {}
  matrix& operator=(const matrix& other) {
    if (this != &other) *this = matrix(other);
    return *this;
  }
  matrix& operator=(matrix&& other) noexcept {
    if (this == &other) return *this;
    rows_ = std::exchange(other.rows_, 0);
    cols_ = std::exchange(other.cols_, 0);
    data_ = std::move(other.data_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bound_ = std::exchange(other.bound_, false);
    other.data_.clear();
    return *this;
  }
  ~matrix() = default;

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] T* data() noexcept { return ptr_; }
  [[nodiscard]] const T* data() const noexcept { return ptr_; }
  [[nodiscard]] std::span<T> flat() noexcept { return {ptr_, size()}; }
  [[nodiscard]] std::span<const T> flat() const noexcept { return {ptr_, size()}; }

  [[nodiscard]] T& operator()(std::size_t r, std::size_t c) noexcept { return ptr_[r * cols_ + c]; }
  [[nodiscard]] const T& operator()(std::size_t r, std::size_t c) const noexcept {
    return ptr_[r * cols_ + c];
  }

  [[nodiscard]] matrix_view<T> view() noexcept { return {ptr_, rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> view() const noexcept { return {ptr_, rows_, cols_, cols_}; }
  operator matrix_view<T>() noexcept { return view(); }             // NOLINT: views are cheap
  operator matrix_view<const T>() const noexcept { return view(); } // NOLINT

  /// Reshape to rows x cols, zero-filled; keeps the allocation where it is large enough. Not for
  /// a bound matrix (bind): its memory is someone else's.
  void resize(std::size_t rows, std::size_t cols) {
    if (bound_) {
      throw error(
          "matrix::resize: the matrix is bound to memory it does not own (a trainer's buffer); a " +
          std::to_string(rows_) + " x " + std::to_string(cols_) + " matrix cannot become " +
          std::to_string(rows) + " x " + std::to_string(cols));
    }
    rows_ = rows;
    cols_ = cols;
    data_.assign(rows * cols, T{});
    ptr_ = data_.data();
    bound_ = false;
  }
  void fill(T v) {
    if (ptr_ == nullptr && size() != 0)
      throw error("matrix::fill: the matrix is bound to no memory (bind(nullptr))");
    std::fill_n(ptr_, size(), v);
  }

  /// Makes the matrix a view of rows() x cols() elements at `external`, which the caller owns
  /// and keeps alive (a trainer's flat parameter or gradient buffer: the layer then computes in
  /// it, and nothing is copied); its own elements are freed. nullptr leaves it with no memory
  /// at all (a zero<3> layer between uses): bind again before the layer runs.
  void bind(T* external) noexcept {
    decltype(data_)().swap(data_);
    ptr_ = external;
    bound_ = true;
  }
  /// Whether the elements are someone else's (bind).
  [[nodiscard]] bool bound() const noexcept { return bound_; }

private:
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::vector<T, detail::tallied_allocator<T>> data_; // charged to the thread's tally where made
  T* ptr_ = nullptr; // data_.data(), or the memory bind() was given
  bool bound_ = false;
};

namespace detail {

[[noreturn]] WEFT_COLD inline void shape_error(std::string_view where, std::string_view what,
                                               std::size_t got_r, std::size_t got_c,
                                               std::size_t want_r, std::size_t want_c) {
  throw error(std::string(where) + ": " + std::string(what) + " is " + std::to_string(got_r) +
              " x " + std::to_string(got_c) + ", expected " + std::to_string(want_r) + " x " +
              std::to_string(want_c));
}

} // namespace detail

/// Copies the elements of a host view, row after row, into `out`, which must hold exactly
/// rows x cols of them (a flat buffer for a collective or an optimizer; the view's ld may exceed
/// its cols). copy_from_flat is the way back.
template <class T, class U>
void copy_to_flat(matrix_view<T> v, std::span<U> out) {
  if (out.size() != v.size()) {
    throw error("copy_to_flat: a " + std::to_string(v.rows()) + " x " + std::to_string(v.cols()) +
                " view into " + std::to_string(out.size()) + " elements");
  }
  for (std::size_t r = 0; r < v.rows(); ++r)
    std::copy_n(v.row(r).begin(), v.cols(), out.begin() + r * v.cols());
}
template <class T, class U>
void copy_from_flat(std::span<U> in, matrix_view<T> v) {
  if (in.size() != v.size()) {
    throw error("copy_from_flat: " + std::to_string(in.size()) + " elements into a " +
                std::to_string(v.rows()) + " x " + std::to_string(v.cols()) + " view");
  }
  for (std::size_t r = 0; r < v.rows(); ++r)
    std::copy_n(in.begin() + r * v.cols(), v.cols(), v.row(r).begin());
}

/// Throws weft::error naming `where` and `what` unless v is rows x cols.
template <class T>
void expect_shape(std::string_view where, std::string_view what, matrix_view<T> v, std::size_t rows,
                  std::size_t cols) {
  if (v.rows() != rows || v.cols() != cols)
    detail::shape_error(where, what, v.rows(), v.cols(), rows, cols);
}

} // namespace weft
