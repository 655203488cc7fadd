#pragma once
// What every suite benchmark does for one case: the per-rank count of a collective of a
// given nccl-tests size, the call itself for any collective, and the cost model's price of
// the very plans the call runs, so each measured row carries its prediction.
#include <weft/weft.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/measure.hpp"

namespace weft::bench {

/// nccl-tests' size is the larger buffer of a call: all_gather's output, reduce_scatter's and
/// all_to_all's input (count x ranks); the others' count. Returns weft's per-rank count.
inline std::size_t count_for(collective c, std::size_t bytes, int ranks, std::size_t element_size) {
  const std::size_t elements = bytes / element_size;
  switch (c) {
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all: return elements / static_cast<std::size_t>(ranks);
    default: return elements;
  }
}

/// Buffer sizes (input, output) of a call of `count` per rank, as plan.hpp's table says.
inline std::pair<std::size_t, std::size_t> buffer_sizes(collective c, std::size_t count,
                                                        int ranks) {
  const std::size_t all = count * static_cast<std::size_t>(ranks);
  switch (c) {
    case collective::reduce_scatter: return {all, count};
    case collective::all_gather: return {count, all};
    case collective::all_to_all: return {all, all};
    default: return {count, count};
  }
}

/// One call of collective C with algorithm Algo, float sum, root 0.
template <collective C, class Algo, class Comm>
void call(Comm& c, std::span<const float> in, std::span<float> out) {
  if constexpr (C == collective::all_reduce)
    all_reduce<Algo>(c, in, out);
  else if constexpr (C == collective::reduce_scatter)
    reduce_scatter<Algo>(c, in, out);
  else if constexpr (C == collective::all_gather)
    all_gather<Algo>(c, in, out);
  else if constexpr (C == collective::broadcast)
    broadcast<Algo>(c, out, 0);
  else if constexpr (C == collective::reduce)
    reduce<Algo>(c, in, out, 0);
  else
    all_to_all<Algo>(c, in, out);
}

struct prediction {
  double seconds = 0;
  std::string_view algorithm; // automatic's choice, or Algo's name
};

/// The cost model's price of the plans a call of `count` per rank would run on c.
template <collective C, class Algo, class Comm>
prediction predict(const Comm& c, std::size_t count, std::size_t element_size) {
  const plan_request q{C, c.size(), 0, count, 0, c.node_of(), element_size};
  constexpr bool can_load = requires { requires Comm::peer_access; };
  if constexpr (std::is_same_v<Algo, algo::automatic>) {
    // A communicator that picks by measurement has measured by now (the timed calls ran).
    const algo::candidate* chosen = nullptr;
    if constexpr (requires { c.measured_prices_of(C); }) {
      if (c.measures_automatic() && c.measured_prices_of(C))
        chosen = c.measured_prices_of(C)->pick(q, can_load, true);
    }
    if (chosen == nullptr) chosen = &algo::choose(q, c.cluster(), c.devices(), can_load);
    return {cost_model::price(cost_model::plans_of(chosen->make_plan, q), c.cluster(), c.devices(),
                              element_size),
            chosen->name};
  } else {
    return {cost_model::price(cost_model::plans_of(&Algo::make_plan, q), c.cluster(), c.devices(),
                              element_size),
            Algo::name};
  }
}

/// The cost model's price of several groups of a cluster's devices running the same call at
/// once (e.g. every tensor-parallel group of a mesh), so that they share the nodes' NICs as
/// they do when measured: each group's plans, by the algorithm it would use, are mapped onto
/// the world's ranks and the whole world is simulated.
template <collective C, class Algo>
prediction predict_concurrent(const std::vector<std::vector<int>>& groups,
                              const topology::cluster& cluster, std::size_t count,
                              std::size_t element_size, bool peer_access = true) {
  std::vector<plan> world(static_cast<std::size_t>(cluster.size()));
  for (int w = 0; w < cluster.size(); ++w) {
    world[static_cast<std::size_t>(w)] =
        plan(plan_request{C, cluster.size(), w, count, 0, {}, element_size});
  }
  prediction out;
  for (const auto& members : groups) {
    std::vector<int> node_of;
    for (int w : members)
      node_of.push_back(cluster.node_of(w));
    const plan_request q{C, static_cast<int>(members.size()), 0, count, 0, node_of, element_size};
    plan (*make)(const plan_request&) = nullptr;
    if constexpr (std::is_same_v<Algo, algo::automatic>) {
      const algo::candidate& chosen = algo::choose(q, cluster, members, peer_access);
      make = chosen.make_plan;
      out.algorithm = chosen.name;
    } else {
      make = &Algo::make_plan;
      out.algorithm = Algo::name;
    }
    const auto plans = cost_model::plans_of(make, q);
    for (std::size_t i = 0; i < members.size(); ++i) {
      world[static_cast<std::size_t>(members[i])].append(plans[i], members, {buffer::input, 0},
                                                         {buffer::output, 0}, {buffer::scratch, 0});
    }
  }
  out.seconds = cost_model::price(world, cluster, {}, element_size);
  return out;
}

/// The suite's counters for one row: time_us, algbw_GBps, busbw_GBps (nccl-tests' factor),
/// model_us and measured_over_model; the label names the algorithm the model priced.
inline void set_counters(benchmark::State& state, std::size_t bytes, double seconds,
                         double bus_factor, const prediction& model) {
  const double algbw = static_cast<double>(bytes) / seconds;
  state.counters["time_us"] = seconds * 1e6;
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = algbw * bus_factor / 1e9;
  state.SetLabel(std::string(model.algorithm));
  if (model.seconds <= 0) return; // a case the model does not price
  state.counters["model_us"] = model.seconds * 1e6;
  state.counters["measured_over_model"] = seconds / model.seconds;
}

/// Times collective C with Algo on local ranks laid out as `cluster` (links emulated when
/// opt says so) for one nccl-tests size, and sets the suite's counters: time_us, algbw_GBps,
/// busbw_GBps, model_us (the model's price of the same plans) and measured_over_model.
template <collective C, class Algo>
void run_local_case(benchmark::State& state, const topology::cluster& cluster, local::options opt,
                    std::size_t bytes, double target_seconds = 0.2) {
  const int p = cluster.size();
  const std::size_t count = count_for(C, bytes, p, sizeof(float));
  const auto [in_n, out_n] = buffer_sizes(C, count, p);
  double seconds = 0;
  prediction model;
  for (auto _ : state) {
    local::run(
        cluster,
        [&](local::communicator& c) {
          std::vector<float> in(in_n, 1.0f), out(out_n, 1.0f);
          const double t = time_collective(
              c, [&] { call<C, Algo>(c, std::span<const float>(in), std::span(out)); },
              target_seconds);
          if (c.rank() == 0) {
            seconds = t;
            model = predict<C, Algo>(c, count, sizeof(float));
          }
        },
        opt);
    state.SetIterationTime(seconds);
  }
  set_counters(state, bytes, seconds, bus_factor(C, p), model);
}

} // namespace weft::bench
