#pragma once
// A model's weights as a file of the field's format (safetensors, weft/io/safetensors.hpp): the
// full, unsplit tensors under the names a model family gives them, so that a model trained at one
// mesh loads at another, and weights move between weft and other frameworks.
//
// A model family says how each parameter is stored with a static function
//
//   static weft::layer::stored_tensor stored(const config& c, const std::string& name);
//
// (name: as layer::sequential and the strategy name it, e.g. "block3.attention.qkv.weight"):
// the tensor's name in the file, whether the file holds it transposed (in x out, as GPT-2's
// Conv1D layers do), and where weft's row r of it sits in the file (GPT-2's fused QKV orders its
// rows [q of every head | k | v], weft's [q | k | v] head after head). A tied copy (the output
// layer of a tied model) is not written and reads the table's tensor. Without stored() a
// parameter is stored under its own name as it is. A 1 x n parameter (a bias, a norm) is a 1-D
// tensor of n, and the row order applies along it.
//
// A family may also name the facts of its configuration that decide how its tensors read
// (static std::map<std::string, std::string> describe(const config&): head counts, rotary base,
// norm epsilon...): save_weights writes them into the file's metadata as "weft.<key>", and
// load_weights refuses a file whose "weft.<key>" differs, since a wrong head count reorders a
// fused QKV or a rotary base turns positions without any shape telling. And it may name tensors
// that files of other frameworks carry but that are no parameters (static bool
// buffer(std::string_view name): GPT-2's causal-mask buffers), which loading skips.
//
// write_slice and read_slice move one rank's slice (parameter::row0/col0 in the full shape) of
// one parameter between memory and the file, each run of consecutive file rows in one write or
// read; they are what the strategy's save_weights and load_weights do on every rank.
#include <weft/core/error.hpp>
#include <weft/io/safetensors.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace weft::layer {

/// How one parameter is stored in a weights file.
struct stored_tensor {
  std::string name;
  bool transposed = false; // the file holds the full tensor transposed (columns x rows)
  /// weft's full row r (a 1 x n parameter: element r) is the file's row index_of(r) (before
  /// transposing); empty: r.
  std::function<std::size_t(std::size_t)> index_of = {};
  bool written = true; // false: a tied copy, read from `name` but written by the table
};

/// How Model stores the parameter `name` (see the header comment).
template <class Model>
[[nodiscard]] stored_tensor stored_as(const typename Model::config& c, const std::string& name) {
  if constexpr (requires {
                  { Model::stored(c, name) } -> std::convertible_to<stored_tensor>;
                }) {
    return Model::stored(c, name);
  } else {
    return {name};
  }
}

/// The facts of Model's configuration its weights files record (see the header comment).
template <class Model>
[[nodiscard]] std::map<std::string, std::string> stored_facts(const typename Model::config& c) {
  std::map<std::string, std::string> facts;
  if constexpr (requires {
                  { Model::describe(c) } -> std::convertible_to<std::map<std::string, std::string>>;
                }) {
    for (auto& [k, v] : Model::describe(c))
      facts.emplace("weft." + k, v);
  }
  return facts;
}

/// Whether a file's tensor `name` is a buffer of Model's (skipped), not a missing parameter.
template <class Model>
[[nodiscard]] bool stored_buffer(std::string_view name) {
  if constexpr (requires {
                  { Model::buffer(name) } -> std::convertible_to<bool>;
                }) {
    return Model::buffer(name);
  } else {
    return false;
  }
}

/// The file's shape of a parameter with this full shape.
[[nodiscard]] inline std::vector<std::size_t> stored_shape(const stored_tensor& s,
                                                           std::size_t full_rows,
                                                           std::size_t full_cols) {
  if (full_rows == 1) return {full_cols};
  return s.transposed ? std::vector<std::size_t>{full_cols, full_rows}
                      : std::vector<std::size_t>{full_rows, full_cols};
}

namespace detail {

// Calls f(first, file_first, count) for each run of the local indices [0, n) whose file indices
// (index_of(start + i)) are consecutive.
template <class F>
void for_each_stored_run(const stored_tensor& s, std::size_t start, std::size_t n, F&& f) {
  const auto at = [&](std::size_t i) { return s.index_of ? s.index_of(start + i) : start + i; };
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    while (j < n && at(j) == at(j - 1) + 1)
      ++j;
    f(i, at(i), j - i);
    i = j;
  }
}

} // namespace detail

/// Writes this rank's slice of parameter p (host memory, float) into the file laid out by h.
inline void write_slice(const std::string& path, const safetensors::header& h,
                        const stored_tensor& s, const parameter<float>& p) {
  const auto v = p.value;
  if (p.full_rows == 1) {
    detail::for_each_stored_run(
        s, p.col0, v.cols(), [&](std::size_t i, std::size_t at, std::size_t n) {
          safetensors::write_block(path, h, s.name, 0, at, 1, n, v.data() + i, v.ld());
        });
  } else if (!s.transposed) {
    detail::for_each_stored_run(s, p.row0, v.rows(),
                                [&](std::size_t i, std::size_t at, std::size_t n) {
                                  safetensors::write_block(path, h, s.name, at, p.col0, n, v.cols(),
                                                           v.data() + i * v.ld(), v.ld());
                                });
  } else {
    matrix<float> t(v.cols(), v.rows()); // the slice transposed: file rows are weft's columns
    for (std::size_t r = 0; r < v.rows(); ++r)
      for (std::size_t c = 0; c < v.cols(); ++c)
        t(c, r) = v(r, c);
    detail::for_each_stored_run(s, p.row0, v.rows(),
                                [&](std::size_t i, std::size_t at, std::size_t n) {
                                  safetensors::write_block(path, h, s.name, p.col0, at, v.cols(), n,
                                                           t.data() + i, t.cols());
                                });
  }
}

/// Reads this rank's slice of parameter p from the file into `out` (value's shape, packed).
inline void read_slice(const std::string& path, const safetensors::header& h,
                       const stored_tensor& s, const parameter<float>& p, matrix<float>& out) {
  const std::size_t rows = p.value.rows(), cols = p.value.cols();
  out.resize(rows, cols);
  if (p.full_rows == 1) {
    detail::for_each_stored_run(s, p.col0, cols, [&](std::size_t i, std::size_t at, std::size_t n) {
      safetensors::read_block(path, h, s.name, 0, at, 1, n, out.data() + i, out.cols());
    });
  } else if (!s.transposed) {
    detail::for_each_stored_run(s, p.row0, rows, [&](std::size_t i, std::size_t at, std::size_t n) {
      safetensors::read_block(path, h, s.name, at, p.col0, n, cols, out.data() + i * out.cols(),
                              out.cols());
    });
  } else {
    matrix<float> t(cols, rows);
    detail::for_each_stored_run(s, p.row0, rows, [&](std::size_t i, std::size_t at, std::size_t n) {
      safetensors::read_block(path, h, s.name, p.col0, at, cols, n, t.data() + i, t.cols());
    });
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        out(r, c) = t(c, r);
  }
}

} // namespace weft::layer
