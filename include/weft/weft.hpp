#pragma once
// weft: the core, topologies, meshes, collectives, the local transport, the cost model and
// pipelines: what every user of the collectives needs, with a plain C++20 host compiler. Include
// the rest where it is used: <weft/optim.hpp> (data parallelism, ZeRO, checkpoints), <weft/sim.hpp>
// (the simulator and planner), <weft/strategy.hpp> and <weft/layer/...> (the layers and the 3D
// trainer; a CBLAS), <weft/cuda.hpp> (nvcc, NCCL).
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/pairwise.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/automatic_choice.hpp>
#include <weft/comm/barrier.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/send_recv.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/comm/two_level.hpp>
#include <weft/core/error.hpp>
#include <weft/core/half.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>
#include <weft/mesh/make_comms.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/pipeline.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/topology/topology.hpp>
