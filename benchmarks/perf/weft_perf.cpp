// weft-perf: times and checks weft's collectives the way NVIDIA's nccl-tests time NCCL's, so
// the figures read like theirs (algbw, busbw, #wrong, average bus bandwidth), and prints
// beside each measurement what weft's cost model predicts for the same plan.
//
//   weft-perf -b 8 -e 64M -f 2 -o all_reduce -d float -a all           # 4 ranks as threads
//   weft-perf --topology "2x4,intra=shm:8GB/s:2us,inter=net:0.5GB/s:20us" -a ring,hierarchical
//   mpirun -n 4 weft-perf -t mpi -o all -d all -r all -a all -c 1
//
// Each (op, dtype, redop, algorithm) is one table; the tables of one (op, dtype, redop) are
// timed together, so that the algorithms compare under the same conditions. For every size,
// all ranks fill their inputs and every algorithm runs -w untimed calls; then the -n timed
// calls of each algorithm (under --min_time_ms, as many more as the fastest algorithm's
// warm-up calls say fill the time) go in 4 turns (fewer if there are fewer calls), the
// algorithms in rotation, each turn's calls back to back after a barrier and one untimed
// call; the reported time is the mean per call of the slowest rank. With -c 1 one more call
// of each runs over poisoned outputs and every rank compares its output with a serial
// reference (pattern.hpp). A comparison's tables print when all its sizes are done.
#include <weft/weft.hpp>

#include "memory.hpp"
#include "options.hpp"
#include "pattern.hpp"
#include "report.hpp"

#if WEFT_PERF_MPI
#include <weft/comm/transport/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/measure.hpp"

namespace weft::perf {

// --- names to types ----------------------------------------------------------------------

template <class F>
decltype(auto) with_collective(collective c, F&& f) {
  switch (c) {
    case collective::all_reduce:
      return f(std::integral_constant<collective, collective::all_reduce>{});
    case collective::reduce_scatter:
      return f(std::integral_constant<collective, collective::reduce_scatter>{});
    case collective::all_gather:
      return f(std::integral_constant<collective, collective::all_gather>{});
    case collective::broadcast:
      return f(std::integral_constant<collective, collective::broadcast>{});
    case collective::reduce: return f(std::integral_constant<collective, collective::reduce>{});
    case collective::all_to_all: break;
  }
  return f(std::integral_constant<collective, collective::all_to_all>{});
}

template <class F>
decltype(auto) with_algorithm(algorithm a, F&& f) {
  switch (a) {
    case algorithm::ring: return f(std::type_identity<algo::ring>{});
    case algorithm::tree: return f(std::type_identity<algo::tree>{});
    case algorithm::halving_doubling: return f(std::type_identity<algo::halving_doubling>{});
    case algorithm::recursive_doubling: return f(std::type_identity<algo::recursive_doubling>{});
    case algorithm::direct: return f(std::type_identity<algo::direct>{});
    case algorithm::pairwise: return f(std::type_identity<algo::pairwise>{});
    case algorithm::hierarchical:
      return f(std::type_identity<algo::hierarchical<algo::ring, algo::ring>>{});
    case algorithm::hierarchical_ring_tree:
      return f(std::type_identity<algo::hierarchical<algo::ring, algo::tree>>{});
    case algorithm::hierarchical_direct_ring:
      return f(std::type_identity<algo::hierarchical<algo::direct, algo::ring>>{});
    case algorithm::automatic: break;
  }
  return f(std::type_identity<algo::automatic>{});
}

template <class F>
decltype(auto) with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(std::type_identity<float>{});
    case dtype::float64: return f(std::type_identity<double>{});
    case dtype::float16: return f(std::type_identity<half>{});
    case dtype::bfloat16: return f(std::type_identity<bfloat16>{});
    case dtype::int32: return f(std::type_identity<std::int32_t>{});
    case dtype::int64: break;
  }
  return f(std::type_identity<std::int64_t>{});
}

template <class F>
decltype(auto) with_redop(redop r, F&& f) {
  switch (r) {
    case redop::prod: return f(std::type_identity<op::prod>{});
    case redop::min: return f(std::type_identity<op::min>{});
    case redop::max: return f(std::type_identity<op::max>{});
    case redop::avg: return f(std::type_identity<op::avg>{});
    case redop::sum:
    case redop::none: break;
  }
  return f(std::type_identity<op::sum>{});
}

/// Algorithms that load from peers' buffers, which only transports with peer access run.
inline bool needs_peer_access(algorithm a) {
  return with_algorithm(a, []<class A>(std::type_identity<A>) {
    return algo::capabilities_of<A>.loads != algo::peer_loads::none;
  });
}

inline bool serves(algorithm a, collective c) {
  return with_algorithm(a, [&]<class A>(std::type_identity<A>) { return A::serves(c); });
}

/// Plans that the tool does not time: the algorithm's generator (null for automatic) and name.
inline std::pair<plan (*)(const plan_request&), std::string_view> generator_of(algorithm a) {
  return with_algorithm(a,
                        [&]<class A>(std::type_identity<A>)
                            -> std::pair<plan (*)(const plan_request&), std::string_view> {
                          if constexpr (std::is_same_v<A, algo::automatic>) {
                            return {nullptr, A::name};
                          } else {
                            return {&A::make_plan, A::name};
                          }
                        });
}

// --- one table -----------------------------------------------------------------------------

struct table_case {
  collective op;
  dtype type;
  redop rop;
  algorithm algo;
};

/// Every table the options ask for that the transport can run, in the order given.
inline std::vector<table_case> cases_of(const config& cfg, bool peer_access) {
  std::vector<table_case> out;
  for (collective c : cfg.ops) {
    for (dtype t : cfg.dtypes) {
      const std::vector<redop> rops = reduces(c) ? cfg.redops : std::vector<redop>{redop::none};
      for (redop r : rops) {
        for (algorithm a : cfg.algorithms) {
          if (!serves(a, c) || (needs_peer_access(a) && !peer_access)) continue;
          out.push_back({c, t, r, a});
        }
      }
    }
  }
  return out;
}

/// One line per algorithm asked for that skips some of the ops asked for, and why.
inline std::vector<std::string> skipped_of(const config& cfg, bool peer_access,
                                           std::string_view transport) {
  std::vector<std::string> notes;
  for (algorithm a : cfg.algorithms) {
    std::string ops;
    for (collective c : cfg.ops) {
      if (!serves(a, c)) ops += (ops.empty() ? "" : ", ") + std::string(name_of(c));
    }
    if (needs_peer_access(a) && !peer_access) {
      notes.push_back(std::string(name_of(a)) + ": loads from peers' buffers, which the " +
                      std::string(transport) + " transport cannot");
    } else if (!ops.empty()) {
      notes.push_back(std::string(name_of(a)) + ": does not plan " + ops);
    }
  }
  return notes;
}

// Buffer sizes per rank in elements, for a per-rank count in plan.hpp's sense.
constexpr bool blocked(collective c) noexcept {
  return c == collective::reduce_scatter || c == collective::all_gather ||
         c == collective::all_to_all;
}
constexpr std::size_t input_count(collective c, std::size_t count, std::size_t p) noexcept {
  return input_per_rank(c) ? count * p : count;
}
constexpr std::size_t output_count(collective c, std::size_t count, std::size_t p) noexcept {
  return output_per_rank(c) ? count * p : count;
}

template <class Comm, class T>
using call_fn = void (*)(Comm&, std::span<const T>, std::span<T>, std::size_t, int);

/// One call of collective C with Algo and Op over the leading elements of the rank's buffers.
template <collective C, class Algo, class Op, class Comm, class T>
void call(Comm& c, std::span<const T> in, std::span<T> out, std::size_t count, int root) {
  const auto p = static_cast<std::size_t>(c.size());
  if constexpr (C == collective::all_reduce) {
    weft::all_reduce<Algo>(c, in.first(count), out.first(count), Op{});
  } else if constexpr (C == collective::reduce_scatter) {
    weft::reduce_scatter<Algo>(c, in.first(count * p), out.first(count), Op{});
  } else if constexpr (C == collective::all_gather) {
    weft::all_gather<Algo>(c, in.first(count), out.first(count * p));
  } else if constexpr (C == collective::broadcast) {
    weft::broadcast<Algo>(c, out.first(count), root);
  } else if constexpr (C == collective::reduce) {
    weft::reduce<Algo>(c, in.first(count), out.first(count), root, Op{});
  } else {
    weft::all_to_all<Algo>(c, in.first(count * p), out.first(count * p));
  }
}

/// Runs body(call_fn<Comm, T>) with the call of tc's op, algorithm, type and redop.
template <class Comm, class Body>
void with_call(const table_case& tc, Body&& body) {
  with_collective(tc.op, [&]<collective C>(std::integral_constant<collective, C>) {
    with_algorithm(tc.algo, [&]<class Algo>(std::type_identity<Algo>) {
      if constexpr (Algo::serves(C) && runs_algorithm<Comm, Algo>) {
        with_type(tc.type, [&]<class T>(std::type_identity<T>) {
          if constexpr (reduces(C)) {
            with_redop(tc.rop, [&]<class Op>(std::type_identity<Op>) {
              body(static_cast<call_fn<Comm, T>>(&call<C, Algo, Op, Comm, T>));
            });
          } else {
            body(static_cast<call_fn<Comm, T>>(&call<C, Algo, op::sum, Comm, T>));
          }
        });
      } else {
        throw error(std::string(name_of(tc.algo)) + " cannot run " + std::string(name_of(C)) +
                    " here"); // cases_of() leaves these out
      }
    });
  });
}

/// Counts rank r's wrong output elements after one call of tc.op.
template <class T>
std::int64_t check_output(collective op, const pattern& pat, int r, int p, int root,
                          std::size_t count, std::span<const T> out) {
  const auto ur = static_cast<std::size_t>(r);
  switch (op) {
    case collective::all_reduce:
      return count_wrong(
          out.first(count), [&](std::size_t i) { return pat.reduced(i); }, pat.tolerance());
    case collective::reduce_scatter:
      return count_wrong(
          out.first(count), [&](std::size_t i) { return pat.reduced(ur * count + i); },
          pat.tolerance());
    case collective::all_gather:
      return count_wrong(out.first(count * static_cast<std::size_t>(p)), [&](std::size_t i) {
        return static_cast<double>(pat.input(static_cast<int>(i / count), i % count));
      });
    case collective::broadcast:
      return count_wrong(out.first(count),
                         [&](std::size_t i) { return static_cast<double>(pat.input(root, i)); });
    case collective::reduce:
      return r == root ? count_wrong(
                             out.first(count), [&](std::size_t i) { return pat.reduced(i); },
                             pat.tolerance())
                       : 0;
    case collective::all_to_all:
      return count_wrong(out.first(count * static_cast<std::size_t>(p)), [&](std::size_t i) {
        return static_cast<double>(pat.input(static_cast<int>(i / count), ur * count + i % count));
      });
  }
  return 0;
}

/// The tables of one comparison: the cases of one op, type and redop, one per algorithm
/// (cases_of lists them consecutively).
inline std::vector<std::span<const table_case>> comparisons(const std::vector<table_case>& cases) {
  std::vector<std::span<const table_case>> out;
  std::size_t first = 0;
  for (std::size_t i = 1; i <= cases.size(); ++i) {
    if (i == cases.size() || cases[i].op != cases[first].op || cases[i].type != cases[first].type ||
        cases[i].rop != cases[first].rop) {
      out.push_back(std::span(cases).subspan(first, i - first));
      first = i;
    }
  }
  return out;
}

/// Runs body(const std::vector<call_fn<Comm, T>>&) with the calls of a comparison's tables.
template <class Comm, class Body>
void with_calls(std::span<const table_case> group, Body&& body) {
  with_type(group.front().type, [&]<class T>(std::type_identity<T>) {
    std::vector<call_fn<Comm, T>> fns;
    for (const table_case& tc : group) {
      with_call<Comm>(tc, [&]<class U>(call_fn<Comm, U> fn) {
        if constexpr (std::is_same_v<U, T>) fns.push_back(fn);
      });
    }
    body(fns);
  });
}

/// How many turns a comparison's algorithms take at each size (fewer when -n is smaller).
inline constexpr int comparison_turns = 4;

/// What rank 0 has finished of a comparison, and what it is running: for the report when a
/// call fails.
struct comparison_progress {
  std::vector<std::vector<row>> rows; // one list per table
  std::string running;                // "tree at 65536 B"
};

/// Runs one comparison's tables on this rank, size by size, the algorithms taking turns: at
/// each size every algorithm runs its -w untimed calls, then the -n timed calls go in
/// comparison_turns turns, each turn starting one algorithm further on; in a turn the ranks
/// meet at a barrier, make one untimed call (which also absorbs the ranks' leaving the barrier
/// at different times and the switch from another algorithm) and then the turn's calls back
/// to back. Whatever slows the machine for a while (where the scheduler has put the threads,
/// another program) so falls on all of them alike. `agree` gives every rank the max and the
/// sum of a value over the ranks; `progress` is non-null on rank 0 only. Returns the
/// comparison's wrong elements (all ranks).
template <class Comm, class T, class Agree>
std::int64_t run_comparison(Comm& c, Agree& agree, const config& cfg,
                            std::span<const table_case> group,
                            const std::vector<call_fn<Comm, T>>& fns,
                            comparison_progress* progress) {
  using clock = std::chrono::steady_clock;
  const int p = c.size();
  const int r = c.rank();
  const auto up = static_cast<std::size_t>(p);
  const std::size_t n = group.size();
  const table_case& first = group.front();
  const int root = rooted(first.op) ? cfg.root : 0;
  const pattern pat(first.op, first.rop, first.type, p);
  // Every size fits buffers of max_bytes (the blocked ops' count x ranks never exceeds it).
  std::vector<T> in_buf(cfg.max_bytes / sizeof(T));
  std::vector<T> out_buf(cfg.max_bytes / sizeof(T));
  std::int64_t group_wrong = 0;
  // automatic on a communicator that measures its prices does so at its first call, and at
  // its first call past the first sizes measured, all ranks together: here, for the largest
  // size of the run, before any call is timed, whatever the warm-up.
  for (const table_case& tc : group) {
    if (generator_of(tc.algo).first != nullptr || cfg.sizes().empty()) continue;
    const std::size_t largest = cfg.sizes().back() / sizeof(T);
    const std::size_t count = std::max<std::size_t>(1, blocked(tc.op) ? largest / up : largest);
    with_collective(tc.op, [&](auto op) {
      (void)automatic_choice<decltype(op)::value, T>(c, count, root);
      return 0;
    });
  }
  std::vector<double> mine(n);
  for (const std::size_t bytes : cfg.sizes()) {
    const std::size_t elements = bytes / sizeof(T);
    const std::size_t count = blocked(first.op) ? elements / up : elements;
    const std::size_t total = blocked(first.op) ? count * up : count;
    const std::span<T> in(in_buf.data(), input_count(first.op, count, up));
    const std::span<T> out(out_buf.data(), output_count(first.op, count, up));
    fill_input(pat, r, in);
    // Broadcast works in place on `out`: the root's holds the data, which every call keeps.
    if (first.op == collective::broadcast && r == root) fill_input(pat, r, out);
    const auto once = [&](std::size_t j) { fns[j](c, std::span<const T>(in), out, count, root); };
    // A barrier, one untimed call (the ranks leave the barrier one by one), then `calls` calls
    // of algorithm j back to back: their seconds on this rank.
    const auto timed = [&](std::size_t j, int calls) {
      c.barrier();
      once(j);
      const auto t0 = clock::now();
      for (int i = 0; i < calls; ++i)
        once(j);
      return std::chrono::duration<double>(clock::now() - t0).count();
    };

    const auto running = [&](std::size_t j) {
      if (progress != nullptr)
        progress->running =
            std::string(name_of(group[j].algo)) + " at " + std::to_string(total * sizeof(T)) + " B";
    };
    // The warm-up calls; under --min_time_ms the last of them (at least one) timed after a
    // barrier and one more untimed call, as a turn is: each algorithm's per call, the slowest
    // rank's, agreed by all ranks.
    const bool min_time = cfg.min_time_ms > 0;
    const int warm_timed = min_time ? std::max(cfg.warmup - 1, 1) : 0;
    double fastest = std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < n; ++j) {
      running(j);
      for (int i = 0; i < cfg.warmup - warm_timed; ++i)
        once(j);
      if (min_time) fastest = std::min(fastest, agree.max(c, timed(j, warm_timed) / warm_timed));
    }
    // Under --min_time_ms every row of the size makes as many calls as the fastest algorithm
    // needs to fill the time (the same count in every row, so that the rows compare like for
    // like; a slower algorithm's row takes longer), never fewer than -n, at most 2^24 unless
    // -n asks more.
    int iters = cfg.iters;
    if (min_time && fastest > 0) {
      const double wanted = std::ceil(cfg.min_time_ms * 1e-3 / fastest);
      iters = std::max(cfg.iters, static_cast<int>(std::min(wanted, double{1 << 24})));
    }
    const int turns = std::max(1, std::min(iters, comparison_turns));
    std::fill(mine.begin(), mine.end(), 0.0);
    for (int k = 0; k < turns; ++k) {
      const int calls = iters / turns + (k < iters % turns ? 1 : 0);
      for (std::size_t q = 0; q < n; ++q) {
        const std::size_t j = (q + static_cast<std::size_t>(k)) % n;
        running(j);
        mine[j] += timed(j, calls);
      }
    }

    for (std::size_t j = 0; j < n; ++j) {
      const table_case& tc = group[j];
      const double seconds = agree.max(c, mine[j] / iters);
      std::int64_t wrong = -1;
      if (cfg.check) {
        running(j);
        if (tc.op == collective::broadcast && r == root) {
          fill_input(pat, r, out);
        } else {
          fill_poison(out);
        }
        c.barrier();
        once(j);
        wrong = agree.sum(c, check_output<T>(tc.op, pat, r, p, root, count, out));
        group_wrong += wrong;
      }
      if (progress == nullptr) continue;
      // The model prices the plans this call ran: automatic's pick, asked as dispatch asks it
      // (the calls above have measured what a measuring communicator needs); where automatic
      // took the communicator's own collective, the price automatic weighed it by.
      const auto [make_plan, algorithm_name] = generator_of(tc.algo);
      const plan_request q{tc.op, p, 0, count, root, c.node_of(), sizeof(T)};
      plan (*generator)(const plan_request&) = make_plan;
      std::string chosen(algorithm_name);
      std::optional<double> vendor_price;
      if (generator == nullptr) {
        const algo::choice pick = with_collective(tc.op, [&](auto op) {
          return with_redop(tc.rop, [&]<class Op>(std::type_identity<Op>) {
            return automatic_choice<decltype(op)::value, T, Op>(c, count, root);
          });
        });
        chosen = pick.name();
        if (pick.vendor) {
          vendor_price = pick.vendor_seconds;
        } else {
          generator = pick.plan->make_plan;
        }
      }
      const double model = vendor_price ? *vendor_price
                                        : cost_model::price(cost_model::plans_of(generator, q),
                                                            c.cluster(), c.devices(), sizeof(T));
      const double algbw = static_cast<double>(total * sizeof(T)) / seconds / 1e9;
      progress->rows[j].push_back(row{tc.op, tc.type, tc.rop, tc.algo, chosen, total * sizeof(T),
                                      count, rooted(tc.op) ? root : -1, seconds * 1e6, algbw,
                                      algbw * bench::bus_factor(tc.op, p), model * 1e6, wrong,
                                      iters});
    }
  }
  return group_wrong;
}

/// Prints a comparison's tables, each with the rows it finished.
inline void report_comparison(reporter& rep, std::span<const table_case> group,
                              comparison_progress& progress) {
  for (std::size_t j = 0; j < group.size(); ++j) {
    const table_case& tc = group[j];
    rep.table_header(tc.op, tc.type, tc.rop, tc.algo);
    for (row& x : progress.rows[j])
      rep.add(std::move(x));
    progress.rows[j].clear();
  }
}

// --- transports ----------------------------------------------------------------------------

/// Max and sum over the threads of one local::run, through memory they share.
class local_agree {
public:
  explicit local_agree(int ranks)
      : d_(static_cast<std::size_t>(ranks)), n_(static_cast<std::size_t>(ranks)) {}
  double max(local::communicator& c, double v) {
    d_[static_cast<std::size_t>(c.rank())] = v;
    c.barrier(); // every rank's store is visible after it
    const double m = *std::max_element(d_.begin(), d_.end());
    c.barrier(); // nobody overwrites a slot before all have read
    return m;
  }
  std::int64_t sum(local::communicator& c, std::int64_t v) {
    n_[static_cast<std::size_t>(c.rank())] = v;
    c.barrier();
    std::int64_t s = 0;
    for (std::int64_t x : n_)
      s += x;
    c.barrier();
    return s;
  }

private:
  std::vector<double> d_;
  std::vector<std::int64_t> n_;
};

/// A comparison's failure as the report names it: "all_reduce float sum (ring, tree), tree at
/// 65536 B: <what>".
inline std::string describe_failure(std::span<const table_case> group,
                                    const comparison_progress& progress, std::string_view what) {
  const table_case& tc = group.front();
  std::string out = std::string(name_of(tc.op)) + " " + std::string(name_of(tc.type)) + " " +
                    std::string(name_of(tc.rop)) + " (";
  for (std::size_t j = 0; j < group.size(); ++j)
    out += (j == 0 ? "" : ", ") + std::string(name_of(group[j].algo));
  return out + "), " + (progress.running.empty() ? "before any call" : progress.running) + ": " +
         std::string(what);
}

/// Every table on ranks as threads, each comparison (one op, type and redop, every algorithm
/// asked for) in its own local::run, so that one that throws ends only its own tables, after
/// printing the rows they finished. Returns the exit status.
inline int run_local(const config& cfg) {
  const topology::cluster cluster = cfg.cluster ? *cfg.cluster : topology::host(cfg.ranks);
  local::options opt{.emulate_links = cfg.cluster.has_value()};
  if (cfg.measured) {
    opt.automatic =
        *cfg.measured ? local::automatic_prices::measured : local::automatic_prices::model;
  }
  // Bound where the threads outnumber the CPUs, so that which ranks share a core stays put
  // while the tables run (docs/benchmarks.md); the environment's binding where it is set.
  const char* env_binding = std::getenv("WEFT_BINDING");
  if (cfg.binding) {
    opt.binding = cfg.binding;
  } else if (env_binding == nullptr || *env_binding == '\0') {
    opt.binding = local::thread_binding::automatic;
  }
  const std::vector<table_case> cases = cases_of(cfg, local::communicator::peer_access);
  if (cases.empty()) {
    std::fprintf(
        stderr,
        "weft-perf: none of the algorithms given serves the ops given (see weft-perf -h)\n");
    return 2;
  }
  if (const std::string bad = memory_problem(
          cfg.max_bytes, static_cast<std::size_t>(cluster.size()), available_memory());
      !bad.empty()) {
    std::fprintf(stderr, "weft-perf: %s\n", bad.c_str());
    return 2;
  }
  reporter rep(cfg);
  if (!cfg.json_path.empty()) {
    try {
      rep.open_json(cfg.json_path);
    } catch (const error& e) {
      std::fprintf(stderr, "weft-perf: %s\n", e.what());
      return 2;
    }
  }
  std::vector<int> devices(static_cast<std::size_t>(cluster.size()));
  for (std::size_t i = 0; i < devices.size(); ++i)
    devices[i] = static_cast<int>(i);
  rep.header(cluster, devices, opt.emulate_links,
             weft::detail::bound_cpus(opt, cluster.size(), weft::detail::allowed_cpus()).of_rank);
  rep.skipped(skipped_of(cfg, local::communicator::peer_access, "local"));
  bool threw = false;
  for (const std::span<const table_case> group : comparisons(cases)) {
    comparison_progress progress{std::vector<std::vector<row>>(group.size()), {}};
    try {
      with_calls<local::communicator>(
          group, [&]<class T>(const std::vector<call_fn<local::communicator, T>>& fns) {
            local_agree agree(cluster.size());
            local::run(
                cluster,
                [&](local::communicator& c) {
                  run_comparison<local::communicator, T>(c, agree, cfg, group, fns,
                                                         c.rank() == 0 ? &progress : nullptr);
                },
                opt);
          });
      report_comparison(rep, group, progress);
    } catch (const std::exception& e) {
      threw = true;
      report_comparison(rep, group, progress);
      const std::string what = describe_failure(group, progress, e.what());
      std::fprintf(stderr, "weft-perf: %s\n", what.c_str());
      rep.failed(what);
    }
  }
  rep.summary();
  if (!cfg.json_path.empty()) rep.write_json(cluster.to_string());
  return threw || rep.wrong() > 0 ? 1 : 0;
}

#if WEFT_PERF_MPI
/// Max and sum over the processes, with MPI's own reduction (independent of weft's).
struct mpi_agree {
  static double max(mpi::communicator& c, double v) {
    WEFT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, c.native()));
    return v;
  }
  static std::int64_t sum(mpi::communicator& c, std::int64_t v) {
    WEFT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, c.native()));
    return v;
  }
};

/// Every table on this process's rank of MPI_COMM_WORLD. An error ends the whole job (the
/// other processes may be blocked in a collective with this one). Returns the exit status.
inline int run_mpi(config cfg, int& argc, char**& argv) {
  mpi::environment env(argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Options that depend on the job's size: every process sees the same, so all return 2.
  std::string bad;
  if (cfg.cluster && cfg.cluster->size() != size) {
    bad = "--topology has " + std::to_string(cfg.cluster->size()) + " devices but mpirun started " +
          std::to_string(size) + " processes";
  } else if (cfg.ranks_given && cfg.ranks != size) {
    // With -t mpi the ranks are mpirun's processes; -g cannot add or drop any.
    bad = "-g " + std::to_string(cfg.ranks) + " asks for " + std::to_string(cfg.ranks) +
          " ranks, but with -t mpi the ranks are mpirun's " + std::to_string(size) + " processes";
  } else if (cfg.root >= size) {
    bad = "--root " + std::to_string(cfg.root) + " is not a rank of " + std::to_string(size);
  }
  if (!bad.empty()) {
    if (rank == 0) std::fprintf(stderr, "weft-perf: %s (see weft-perf -h)\n", bad.c_str());
    return 2;
  }
  cfg.ranks = size;
  const std::vector<table_case> cases = cases_of(cfg, mpi::communicator::peer_access);
  if (cases.empty()) {
    if (rank == 0)
      std::fprintf(stderr,
                   "weft-perf: none of the algorithms given serves the ops given over MPI\n");
    return 2;
  }
  {
    // The processes of one node share its memory: each checks for its node, and the first
    // process whose node is short says so.
    MPI_Comm node = MPI_COMM_NULL;
    WEFT_MPI_TRY(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
        "weft-perf");
    int here = 1;
    MPI_Comm_size(node, &here);
    MPI_Comm_free(&node);
    const std::string short_of =
        memory_problem(cfg.max_bytes, static_cast<std::size_t>(here), available_memory());
    int first = short_of.empty() ? size : rank;
    WEFT_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                 "weft-perf");
    if (first < size) {
      if (rank == first) std::fprintf(stderr, "weft-perf: rank %d: %s\n", rank, short_of.c_str());
      return 2;
    }
  }
  // Rank 0 writes the JSON: it opens the file now and tells the others whether it could.
  std::optional<reporter> rep;
  int json_ok = 1;
  if (rank == 0) {
    rep.emplace(cfg);
    if (!cfg.json_path.empty()) {
      try {
        rep->open_json(cfg.json_path);
      } catch (const error& e) {
        std::fprintf(stderr, "weft-perf: %s\n", e.what());
        json_ok = 0;
      }
    }
  }
  WEFT_MPI_TRY(MPI_Bcast(&json_ok, 1, MPI_INT, 0, MPI_COMM_WORLD), "weft-perf --json");
  if (json_ok == 0) return 2;
  std::int64_t wrong = 0;
  // The comparison under way and, on rank 0, the rows it finished: printed before an error
  // ends the job (another rank's error ends it from that rank, without them).
  std::span<const table_case> running;
  comparison_progress progress;
  try {
    mpi::options opt;
    opt.topology = cfg.cluster;
    if (cfg.measured.value_or(false)) opt.measured_automatic = mpi::measured_automatic();
    auto world = mpi::communicator::borrow(MPI_COMM_WORLD, opt);
    if (rep) {
      rep->header(world.cluster(), world.devices(), false);
      rep->skipped(skipped_of(cfg, mpi::communicator::peer_access, "mpi"));
    }
    mpi_agree agree;
    for (const std::span<const table_case> group : comparisons(cases)) {
      running = group;
      progress = comparison_progress{std::vector<std::vector<row>>(group.size()), {}};
      with_calls<mpi::communicator>(
          group, [&]<class T>(const std::vector<call_fn<mpi::communicator, T>>& fns) {
            wrong += run_comparison<mpi::communicator, T>(world, agree, cfg, group, fns,
                                                          rep ? &progress : nullptr);
          });
      if (rep) report_comparison(*rep, group, progress);
      running = {};
    }
    if (rep) {
      rep->summary();
      if (!cfg.json_path.empty()) rep->write_json(world.cluster().to_string());
    }
  } catch (const std::exception& e) {
    if (rep && !running.empty()) {
      report_comparison(*rep, running, progress);
      rep->failed(describe_failure(running, progress, e.what()));
    }
    std::fprintf(stderr, "weft-perf: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    env.abort(1);
  }
  return wrong > 0 ? 1 : 0;
}
#endif

} // namespace weft::perf

int main(int argc, char** argv) {
  using namespace weft::perf;
  config cfg;
  try {
    cfg = parse_args(std::vector<std::string_view>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (cfg.help) {
    std::fputs(usage_text.data(), stdout);
    return 0;
  }
  try {
    if (cfg.transport == transport_kind::mpi) {
#if WEFT_PERF_MPI
      return run_mpi(cfg, argc, argv);
#else
      std::fprintf(stderr, "weft-perf: built without MPI, so -t mpi is not available\n");
      return 2;
#endif
    }
    return run_local(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-perf: %s\n", e.what());
    return 1;
  }
}
