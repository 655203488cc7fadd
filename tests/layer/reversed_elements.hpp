#pragma once
// A host policy whose element-wise steps (bias, GELU, copies, sums, LayerNorm rows) run backwards,
// last element first, as a device may run them in any order (include/weft/layer/exec.hpp): a
// layer run with it must give the host loop's results, so none of its steps depends on the
// order. It counts the steps it ran, so that a test sees they went through it. GEMMs are cblas's.
#include <weft/layer/cblas.hpp>

#include <cstddef>
#include <memory>

namespace weft::test::layer {

struct reversed_elements : weft::layer::cblas {
  std::shared_ptr<std::size_t> steps = std::make_shared<std::size_t>(0);
};

template <class F>
void each_element(const reversed_elements& g, std::size_t rows, std::size_t cols, const F& f) {
  for (std::size_t i = rows * cols; i-- > 0;)
    f(i / cols, i % cols);
  ++*g.steps;
}

} // namespace weft::test::layer
