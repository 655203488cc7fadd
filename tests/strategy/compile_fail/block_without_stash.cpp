// A model whose block keeps no per-microbatch activations (no stash() / restore()): a pipeline
// could not hold one set per microbatch in flight.
// expected error: weft: a model's block is made as block(tp, config, layer, seed, gemm) and has
#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>

#include <vector>

template <class T, class Comm, class Gemm, class SP, class Recompute>
struct forgetful_block {
  forgetful_block(Comm&, const weft::layer::gpt_config&, std::size_t, std::uint64_t, Gemm) {}
  void forward(weft::matrix_view<const T>, weft::matrix_view<T>) {}
  void backward(weft::matrix_view<const T>, weft::matrix_view<T>) {}
  std::vector<weft::layer::parameter<T>> parameters() { return {}; }
  void zero_grad() {}
};

struct forgetful_model {
  using config = weft::layer::gpt_config;
  template <class T, class Comm, class Gemm, class SP, class Recompute>
  struct parts {
    using embedding = weft::layer::gpt_embedding<T, Comm, Gemm, SP>;
    using block = forgetful_block<T, Comm, Gemm, SP, Recompute>;
    using head = weft::layer::gpt_head<T, Comm, Gemm, SP>;
  };
};

using S =
    weft::strategy<weft::mesh<weft::tp<1>, weft::pp<1>, weft::dp<1>>, weft::pipeline::one_f_one_b,
                   weft::optim::zero<1>, weft::layer::recompute::none,
                   weft::layer::no_sequence_parallel, forgetful_model>;

void train(weft::local::communicator& world) { (void)S::make(world, {}); }
