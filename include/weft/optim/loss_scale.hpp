#pragma once
// Dynamic loss scaling for half-precision gradients: the loss is multiplied by scale() before
// the backward; a step whose gradients overflowed (a non-finite global norm, the same number
// on every rank) is skipped and the scale backed off; after `interval` good steps it grows, up to
// max_scale (a scale grown to infinity would back off to infinity and skip every later step).
#include <weft/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace weft::optim {

struct loss_scale_options {
  float initial = 65536.0f;
  float growth = 2.0f;
  float backoff = 0.5f;
  int interval = 2000; // good steps between growths
  float min_scale = 1.0f;
  float max_scale = 16777216.0f; // 2^24
};

class loss_scaler {
public:
  loss_scaler() = default;
  explicit loss_scaler(loss_scale_options o) : o_(o), scale_(o.initial) {
    // min_scale > 0: a scale backed off to 0 makes every later norm 0 / 0 and skips every step.
    if (!(o.initial > 0.0f) || !(o.growth >= 1.0f) || !(o.backoff > 0.0f && o.backoff <= 1.0f) ||
        o.interval < 1 || !(o.max_scale >= o.initial) || !std::isfinite(o.max_scale) ||
        !(o.min_scale > 0.0f) || !(o.min_scale <= o.initial)) {
      throw error(
          "loss_scaler: needs initial > 0, growth >= 1, 0 < backoff <= 1, interval >= 1, a finite "
          "max_scale >= initial and 0 < min_scale <= initial (initial " +
          std::to_string(o.initial) + ", growth " + std::to_string(o.growth) + ", backoff " +
          std::to_string(o.backoff) + ", interval " + std::to_string(o.interval) + ", min_scale " +
          std::to_string(o.min_scale) + ", max_scale " + std::to_string(o.max_scale) + ")");
    }
  }
  [[nodiscard]] float scale() const noexcept { return scale_; }
  /// Records a step: finite gradients or an overflow (then the step must be skipped).
  void update(bool overflow) noexcept {
    if (overflow) {
      scale_ = scale_ * o_.backoff < o_.min_scale ? o_.min_scale : scale_ * o_.backoff;
      good_ = 0;
    } else if (++good_ >= o_.interval) {
      scale_ = std::min(scale_ * o_.growth, o_.max_scale);
      good_ = 0;
    }
  }
  [[nodiscard]] int good_steps() const noexcept { return good_; }
  void restore(float scale, int good_steps) noexcept {
    scale_ = scale;
    good_ = good_steps;
  }

private:
  loss_scale_options o_{};
  float scale_ = 1.0f;
  int good_ = 0;
};

} // namespace weft::optim
