#pragma once
// strategy<...>::trainer::snapshot: a copy of a rank's parameters (weft/strategy.hpp).
#include <weft/comm/communicator.hpp>
#include <weft/layer/parameter.hpp>

#include <cstddef>
#include <vector>

namespace weft::detail {

template <class Schedule, class Sharding, class Recompute, class SP, class Model, class Rule,
          communicator Comm>
class strategy_trainer;

// strategy<...>::trainer::snapshot, which depends on nothing of the strategy's parameters.
class strategy_snapshot {
public:
  strategy_snapshot(const strategy_snapshot&) = delete;
  strategy_snapshot& operator=(const strategy_snapshot&) = delete;
  strategy_snapshot(strategy_snapshot&&) noexcept = default;
  strategy_snapshot& operator=(strategy_snapshot&&) noexcept = default;
  ~strategy_snapshot() = default;
  [[nodiscard]] auto begin() const noexcept { return parameters_.begin(); }
  [[nodiscard]] auto end() const noexcept { return parameters_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return parameters_.size(); }
  [[nodiscard]] const layer::parameter<float>& operator[](std::size_t k) const {
    return parameters_.at(k);
  }

private:
  template <class Schedule, class Sharding, class Recompute, class SP, class Model, class Rule,
            communicator Comm>
  friend class strategy_trainer;
  strategy_snapshot() = default;
  std::vector<float> values_;
  std::vector<layer::parameter<float>> parameters_;
};

} // namespace weft::detail
