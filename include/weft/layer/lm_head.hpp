#pragma once
// A language model's head stage over a tensor-parallel group:
//
//   final norm -> output layer (column-parallel, no bias: vocabulary split like the embedding's)
//     -> vocab-parallel cross entropy
//
//   weft::layer::lm_head<float, Comm, weft::layer::cblas, SP, weft::layer::layer_norm<float, SP>>
//       head(tp, {.hidden = 256, .vocab = 1000, .tensor_id = 17});
//   double loss = head.forward(x, targets, divisor);   // x: rows x hidden (SP: this rank's rows)
//   head.backward(dx);                                 // dx: like x
//
// The loss is the counted targets' summed loss over `divisor` (cross_entropy.hpp: targets equal to
// ignore_index do not count; divisor 0 is their number). Norm is any norm with Norm(hidden, eps,
// exec) and layer_norm's forward/backward/parameters (layer_norm, rms_norm). Parameters: "norm."
// and "output." before the layers' own; tied_weight() is the output layer's weight, the matrix a
// tied model shares with its embedding table.
#include <weft/comm/communicator.hpp>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace weft::layer {

struct lm_head_options {
  std::size_t hidden = 0;
  std::size_t vocab = 0;
  std::uint64_t tensor_id = 0; // the output layer's (init.hpp)
  double init_std = 0.02;
  double norm_eps = 1e-5;
  std::int32_t ignore_index = -100;
  bool output_decay =
      true; // whether weight decay applies to the output layer (a tied one: as the table)
};

template <class T, communicator Comm, class Gemm, class SP, class Norm>
class lm_head {
public:
  using space = space_of<Gemm>;
  using output_type = column_parallel_linear<T, Comm, Gemm, SP>;

  lm_head(Comm& tp, lm_head_options opt, std::uint64_t seed, Gemm gemm = {})
      : gemm_(gemm),
        hidden_(opt.hidden),
        output_decay_(opt.output_decay),
        norm_(opt.hidden, opt.norm_eps, gemm),
        output_(tp, opt.hidden, opt.vocab, seed, opt.tensor_id,
                {.bias = false, .init_std = opt.init_std}, gemm),
        loss_(tp, opt.vocab, gemm, opt.ignore_index) {}

  /// x: rows x hidden; targets: the microbatch's tokens' targets. Keeps what backward needs.
  double forward(matrix_view<const T> x, std::span<const std::int32_t> targets, double divisor) {
    detail::resize(gemm_, normed_, x.rows(), hidden_);
    norm_.forward(x, normed_.view());
    detail::resize(gemm_, logits_, targets.size(), output_.out_local());
    output_.forward(detail::cview(normed_.view()), logits_.view());
    return loss_.forward(detail::cview(logits_.view()), targets, divisor);
  }

  /// dx: like forward's x, overwritten with the loss's gradient.
  void backward(matrix_view<T> dx) {
    detail::resize(gemm_, dlogits_, logits_.rows(), logits_.cols());
    loss_.backward(dlogits_.view());
    detail::resize(gemm_, dnormed_, normed_.rows(), hidden_);
    output_.backward(detail::cview(dlogits_.view()), dnormed_.view());
    norm_.backward(detail::cview(dnormed_.view()), dx);
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    for (auto& p : norm_.parameters())
      ps.push_back(renamed("norm.", std::move(p)));
    for (auto& p : output_.parameters()) {
      p.decay = p.decay && output_decay_;
      ps.push_back(renamed("output.", std::move(p)));
    }
    return ps;
  }
  void zero_grad() {
    norm_.zero_grad();
    output_.zero_grad();
  }
  [[nodiscard]] parameter<T> tied_weight() { return parameters()[norm_.parameters().size()]; }
  [[nodiscard]] std::int32_t ignore_index() const noexcept { return loss_.ignore_index(); }
  /// The logits of the last forward: tokens x this rank's vocabulary columns (in Gemm's memory).
  [[nodiscard]] matrix_view<const T> logits() const noexcept { return logits_.view(); }
  [[nodiscard]] Norm& norm() noexcept { return norm_; }
  [[nodiscard]] output_type& output() noexcept { return output_; }

private:
  static parameter<T> renamed(const char* prefix, parameter<T> p) {
    p.name = prefix + p.name;
    return p;
  }

  Gemm gemm_;
  std::size_t hidden_;
  bool output_decay_;
  Norm norm_;
  output_type output_;
  vocab_parallel_cross_entropy<T, Comm, Gemm> loss_;
  matrix<T, space> normed_, logits_, dlogits_, dnormed_;
};

} // namespace weft::layer
