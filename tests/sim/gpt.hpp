#pragma once
// A GPT-style model (learned positions, tied embedding, 4h FFN) from its shape, for the
// simulator's tests.
#include <weft/sim/model.hpp>

#include <string>
#include <utility>

namespace weft_test {

inline weft::sim::model_spec gpt(std::string name, int layers, int hidden, int heads,
                                 int vocab = 51200, int seq = 2048) {
  weft::sim::model_spec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq = seq;
  m.vocab = vocab;
  return m;
}

} // namespace weft_test
