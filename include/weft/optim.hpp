#pragma once
// Data parallelism and sharded optimizers (host side): update rules, parameter sets and
// buckets, the ZeRO sharding policies, the data-parallel optimizer, checkpoints. Not part of
// weft/weft.hpp: include it where it is used.
#include <weft/comm/async.hpp>
#include <weft/optim/checkpoint.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/optim/loss_scale.hpp>
#include <weft/optim/optimizers.hpp>
#include <weft/optim/param_set.hpp>
#include <weft/optim/sharding.hpp>
