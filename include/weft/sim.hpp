#pragma once
// weft::sim: the simulator. The cost model of plans (cost_model.hpp) and of groups running at
// once (groups.hpp), the hardware and its calibration (hardware.hpp, calibration.hpp), the
// transformer's arithmetic (model.hpp), the step of a TP x PP x DP layout (step.hpp, with its
// pieces: layout.hpp, pipeline_engine.hpp, collective_price.hpp, layer_cost.hpp, memory.hpp), the
// planner (planner.hpp), Chrome traces of a simulated step (trace.hpp) and the memory of weft's own
// host trainer (host.hpp). Host C++20 only.
#include <weft/sim/calibration.hpp>
#include <weft/sim/collective_price.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/sim/groups.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/host.hpp>
#include <weft/sim/layer_cost.hpp>
#include <weft/sim/layout.hpp>
#include <weft/sim/memory.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/pipeline_engine.hpp>
#include <weft/sim/planner.hpp>
#include <weft/sim/sharded.hpp>
#include <weft/sim/step.hpp>
#include <weft/sim/trace.hpp>
