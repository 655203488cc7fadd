#pragma once
// Forwards to the cost model's header, comm/plan/cost_model.hpp, and names it in weft::sim.
#include <weft/comm/plan/cost_model.hpp>

namespace weft::sim {
using cost_model::breakdown;
using cost_model::plans_of;
using cost_model::price;
using cost_model::simulate;
} // namespace weft::sim
