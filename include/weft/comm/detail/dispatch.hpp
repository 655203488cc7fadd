#pragma once
// The path every collective call takes: check the arguments, pick the algorithm (the
// explicit policy, or the cost model's choice for automatic), fetch the rank's plan from a
// cache, optionally check that all ranks make the same call, run the plan, finish avg.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

namespace weft::detail {

// Whether algorithm A's plans send messages: all but those that say otherwise (direct).
template <class A>
inline constexpr bool needs_messages_v = [] {
  if constexpr (requires { A::needs_messages; }) {
    return static_cast<bool>(A::needs_messages);
  } else {
    return true;
  }
}();

template <class A>
inline constexpr bool needs_peer_access_v = [] {
  if constexpr (requires { A::needs_peer_access; }) {
    return static_cast<bool>(A::needs_peer_access);
  } else {
    return false;
  }
}();

/// A rank's plans, by algorithm and request. Plans depend only on their key, so one cache
/// per thread (a rank of the local transport, or an MPI process) is enough.
class plan_cache {
public:
  template <class Make>
  const plan& get(std::string_view algorithm, const plan_request& q, Make&& make) {
    key k{algorithm, q};
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= max_entries) plans_.clear();  // a bound, for programs with many distinct sizes
    return plans_.emplace(std::move(k), make(q)).first->second;
  }
  static plan_cache& mine() {
    thread_local plan_cache cache;
    return cache;
  }

private:
  static constexpr std::size_t max_entries = 1024;
  struct key {
    std::string_view algorithm;  // names are static strings
    plan_request request;
    friend bool operator==(const key&, const key&) = default;
  };
  struct hash {
    std::size_t operator()(const key& k) const noexcept {
      std::size_t h = std::hash<std::string_view>{}(k.algorithm);
      const auto mix = [&](std::size_t v) { h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
      mix(static_cast<std::size_t>(k.request.coll));
      mix(static_cast<std::size_t>(k.request.size));
      mix(static_cast<std::size_t>(k.request.rank));
      mix(k.request.count);
      mix(static_cast<std::size_t>(k.request.root));
      mix(k.request.element_size);
      for (int n : k.request.node_of) mix(static_cast<std::size_t>(n));
      return h;
    }
  };
  std::unordered_map<key, plan, hash> plans_;
};

inline std::atomic<bool>& check_calls_flag() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("WEFT_CHECK_CALLS");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

inline bool check_calls_enabled() { return check_calls_flag().load(std::memory_order_relaxed); }

/// Whether a call on comm is checked: for every communicator when the process-wide switch is
/// on, and for a communicator that asks for it (local::options::check_calls,
/// communicator::set_check_calls, weft::checked_calls).
template <class Comm>
bool check_calls_enabled(const Comm& comm) {
  if (check_calls_enabled()) return true;
  if constexpr (requires { { comm.check_calls() } -> std::convertible_to<bool>; }) {
    return static_cast<bool>(comm.check_calls());
  } else {
    return false;
  }
}

inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// A user functor's type as text, the same in every process of one program: its RTTI name
// (which tells two lambdas of one function apart), or the compiler's function signature
// without RTTI.
template <class Op>
std::string_view type_text() {
#if defined(__cpp_rtti) || defined(__GXX_RTTI) || defined(_CPPRTTI)
  return typeid(Op).name();
#elif defined(_MSC_VER)
  return __FUNCSIG__;
#else
  return __PRETTY_FUNCTION__;
#endif
}

/// The operator as the call check compares and prints it: op_name<Op>() for weft's ops, and
/// for a user functor "user:" and 8 hex digits of its type, so that ranks passing two
/// different functors (a sum here, a max there) are told apart rather than both "user".
template <class Op>
std::string_view call_op_name() {
  if constexpr (requires { Op::name; }) {
    return op_name<Op>();
  } else {
    static const std::string name = [] {
      static constexpr char hex[] = "0123456789abcdef";
      std::string s = "user:";
      const auto h = fnv1a(type_text<Op>());
      for (int shift = 28; shift >= 0; shift -= 4) s += hex[(h >> shift) & 0xf];
      return s;
    }();
    return name;
  }
}

struct call_signature {
  collective coll;
  std::string_view algorithm;
  std::size_t count;
  dtype type;
  std::string_view op;
  int root;
};

WEFT_COLD inline std::string describe(const call_signature& s) {
  return std::string(name_of(s.coll)) + "<" + std::string(s.algorithm) + "> of " + std::to_string(s.count) + " x " +
         std::string(name_of(s.type)) + ", op " + std::string(s.op) + ", root " + std::to_string(s.root);
}

// A call's fingerprint as it travels: the fields that must agree, then the names of the
// algorithm and the operator (up to 32 and 16 characters), so a rank can print another's call.
inline constexpr std::size_t fingerprint_words = 6;
inline constexpr std::size_t fingerprint_name_words = 6;

inline void pack_name(std::string_view name, std::int64_t* words, std::size_t n) {
  char bytes[8 * 6] = {};
  const std::size_t len = name.size() < 8 * n ? name.size() : 8 * n;
  std::copy_n(name.data(), len, bytes);
  std::memcpy(words, bytes, 8 * n);
}

inline std::string unpack_name(const std::int64_t* words, std::size_t n) {
  char bytes[8 * 6 + 1] = {};
  std::memcpy(bytes, words, 8 * n);
  return std::string(bytes);
}

// A table row back as text: "all_reduce<ring> of 6 x int32, op sum, root 0".
WEFT_COLD inline std::string describe_row(const std::int64_t* row) {
  const auto coll = static_cast<collective>(row[0]);
  const auto type = static_cast<dtype>(row[3]);
  return std::string(name_of(coll)) + "<" + unpack_name(row + fingerprint_words, 4) + "> of " +
         std::to_string(row[2]) + " x " + std::string(name_of(type)) + ", op " +
         unpack_name(row + fingerprint_words + 4, 2) + ", root " + std::to_string(row[5]);
}

/// Every rank sends its call's fingerprint to rank 0, which returns the whole table to all;
/// if any differ, every rank throws the same description of who disagrees and how. Only the
/// fingerprints move, so a mismatch is reported before any of the call's data does.
template <class Comm>
WEFT_COLD void check_same_call(Comm& comm, const call_signature& sig) {
  const int p = comm.size();
  if (p == 1) return;
  constexpr std::size_t fields = fingerprint_words;
  constexpr std::size_t words = fingerprint_words + fingerprint_name_words;
  constexpr int tag = 0x7e57;
  std::int64_t mine[words] = {static_cast<std::int64_t>(sig.coll),
                              static_cast<std::int64_t>(fnv1a(sig.algorithm)),
                              static_cast<std::int64_t>(sig.count),
                              static_cast<std::int64_t>(sig.type),
                              static_cast<std::int64_t>(fnv1a(sig.op)),
                              sig.root};
  pack_name(sig.algorithm, mine + fields, 4);
  pack_name(sig.op, mine + fields + 4, 2);
  std::vector<std::int64_t> table(words * static_cast<std::size_t>(p));
  if (comm.rank() == 0) {
    std::copy(mine, mine + words, table.begin());
    for (int r = 1; r < p; ++r) {
      comm.recv(std::span<std::int64_t>(table.data() + words * static_cast<std::size_t>(r), words), r, tag);
    }
    for (int r = 1; r < p; ++r) comm.send(std::span<const std::int64_t>(table), r, tag);
  } else {
    comm.send(std::span<const std::int64_t>(mine, words), 0, tag);
    comm.recv(std::span<std::int64_t>(table), 0, tag);
  }
  std::string diff;
  std::vector<int> agree{0};
  for (int r = 1; r < p; ++r) {
    const std::int64_t* row = table.data() + words * static_cast<std::size_t>(r);
    std::string how;
    for (std::size_t w = 0; w < fields; ++w) {
      if (row[w] != table[w]) {
        static constexpr const char* what[] = {"collective", "algorithm", "count", "type", "op", "root"};
        how += how.empty() ? " in " : ", ";
        how += what[w];
      }
    }
    if (how.empty()) {
      agree.push_back(r);
    } else {
      diff += "; rank " + std::to_string(r) + " differs from rank 0" + how + ": it called " + describe_row(row);
    }
  }
  if (!diff.empty()) {
    std::string same = agree.size() == 1 ? "rank 0" : "ranks";
    if (agree.size() > 1) {
      for (std::size_t i = 0; i < agree.size(); ++i) same += (i == 0 ? " " : ",") + std::to_string(agree[i]);
    }
    const error mismatch(name_of(sig.coll), comm.rank(), error::unknown,
                         "the ranks called different collectives (call check), no data moved: this rank called " +
                             describe(sig) + "; " + same + " called " + describe_row(table.data()) + diff);
    // Every rank throws its own report, so none may throw before all hold the table: a rank
    // that throws aborts the others' pending receives (the local transport's failure rule), and
    // rank 0 scatters the table one rank at a time. The barrier is left only once every rank
    // has the table; a rank aborted inside it (another one threw first) still has it.
    try {
      comm.barrier();
    } catch (const error&) {
    }
    throw mismatch;
  }
}

inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

template <class Comm>
void check_root(const Comm& comm, int root, std::string_view opname) {
  if (root < 0 || root >= comm.size()) {
    throw error(opname, comm.rank(), error::unknown,
                "root " + std::to_string(root) + " outside the communicator of " + std::to_string(comm.size()) + " ranks");
  }
}

/// A communicator with a collective of its own for C (what algo::vendor calls): the member
/// template comm.vendor<C>(in, in_n, out, out_n, count, root, op), which also finishes avg.
template <class Comm, collective C, class T, class Op>
concept vendor_collective = requires(Comm& comm, const T* in, T* out, std::size_t n, int root, const Op& op) {
  comm.template vendor<C>(in, n, out, n, n, root, op);
};

template <collective C, class Comm, class T, class Op>
void run_vendor(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
                const Op& op) {
  static_assert(vendor_collective<Comm, C, T, Op>,
                "weft: algo::vendor forwards to the transport's own collective library, and this communicator has "
                "none (weft::local and weft::mpi run weft's plans only): use algo::automatic or an explicit algorithm "
                "such as algo::ring, or a weft::cuda::nccl::communicator for NCCL's own collectives");
  if constexpr (vendor_collective<Comm, C, T, Op>) {
    check_root(comm, root, name_of(C));
    if (check_calls_enabled(comm)) check_same_call(comm, {C, algo::vendor::name, count, dtype_of<T>, call_op_name<Op>(), root});
    comm.template vendor<C>(in, in_n, out, out_n, count, root, op);  // avg included: nothing to divide here
  }
}

/// A copy of the n elements of `in`, each times 1/ranks (in float): half averages on the host.
template <class T>
std::vector<std::remove_cv_t<T>> scaled_by_ranks(const T* in, std::size_t n, int ranks) {
  std::vector<std::remove_cv_t<T>> scaled(in, in + n);
  const float by = 1.0f / static_cast<float>(ranks);
  for (auto& v : scaled) v = static_cast<std::remove_cv_t<T>>(static_cast<float>(v) * by);
  return scaled;
}

template <collective C, class Algo, class Comm, class T, class Op>
void run_planned(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
                 const Op& op) {
  static_assert(algo::plan_generator<Algo> || std::is_same_v<Algo, algo::automatic>,
                "weft: the algorithm policy must be a weft::algo tag (ring, tree, halving_doubling, recursive_doubling, "
                "direct, pairwise, hierarchical<Intra, Inter>, automatic, vendor)");
  static_assert(plan_executor<Comm>, "weft: this communicator cannot run collectives (no execute())");
  constexpr bool can_load = requires { requires Comm::peer_access; };
  // A load-only transport (weft::cuda::p2p) says so with `static constexpr bool messages = false`.
  constexpr bool can_send = !requires { requires !Comm::messages; };
  if constexpr (!std::is_same_v<Algo, algo::automatic>) {
    static_assert(Algo::serves(C),
                  "weft: this algorithm cannot run this collective. all_reduce: ring, tree, halving_doubling, "
                  "recursive_doubling, direct, hierarchical, automatic; reduce_scatter and all_gather: ring, halving_doubling, direct, hierarchical, "
                  "automatic; broadcast and reduce: ring, tree, direct, automatic; all_to_all: direct, automatic");
    static_assert(!needs_peer_access_v<Algo> || can_load,
                  "weft: this algorithm loads from peers' buffers (algo::direct) and needs a communicator with the "
                  "peer_access capability, such as weft::local; use algo::ring or algo::automatic here");
    static_assert(!needs_messages_v<Algo> || can_send,
                  "weft: this algorithm sends messages, and this communicator only loads from its peers "
                  "(weft::cuda::p2p): use algo::direct or algo::automatic here");
  }
  const std::string_view opname = name_of(C);
  check_root(comm, root, opname);
  plan_request q{C, comm.size(), comm.rank(), count, root, comm.node_of(), sizeof(T)};
  std::string_view algorithm;
  const plan* pl = nullptr;
  if constexpr (std::is_same_v<Algo, algo::automatic>) {
    const auto& chosen = algo::choose(q, comm.cluster(), comm.devices(), can_load, can_send);
    algorithm = chosen.name;
    pl = &plan_cache::mine().get(chosen.name, q, chosen.make_plan);
  } else {
    algorithm = Algo::name;
    pl = &plan_cache::mine().get(Algo::name, q, [](const plan_request& r) { return Algo::make_plan(r); });
  }
  if (check_calls_enabled(comm)) check_same_call(comm, {C, algorithm, count, dtype_of<T>, call_op_name<Op>(), root});
  if constexpr (is_average_v<Op> && std::is_same_v<std::remove_cv_t<T>, half> &&
                !requires { comm.divide(out, out_n); }) {
    if (C == collective::all_reduce || C == collective::reduce_scatter || C == collective::reduce) {
      // half ends at 65504: the sum of the inputs overflows where their mean need not. Each input
      // is scaled by 1/ranks first (as ncclAvg does for floating types), and the plan sums.
      const auto scaled = scaled_by_ranks(in, in_n, comm.size());
      comm.execute(*pl, scaled.data(), in_n, out, out_n, op, opname);
      return;
    }
  }
  comm.execute(*pl, in, in_n, out, out_n, op, opname);
  if constexpr (is_average_v<Op>) {
    if (C != collective::reduce || comm.rank() == root) {
      const std::size_t n = C == collective::reduce ? count : out_n;
      if constexpr (requires { comm.divide(out, n); }) {
        comm.divide(out, n);  // buffers the host cannot touch (device memory): the transport's kernel
      } else {
        divide(out, n, comm.size());
      }
    }
  }
}

/// Runs collective C with algorithm Algo on comm. `in`/`out` are the rank's buffers as the
/// table in plan.hpp describes them; `count` is the per-rank count in that table's sense.
/// algo::vendor hands the call to the communicator's own collective; every other policy
/// runs a plan.
template <collective C, class Algo, class Comm, class T, class Op>
void run_collective(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
                    const Op& op) {
  if constexpr (std::is_same_v<Algo, algo::vendor>) {
    run_vendor<C>(comm, in, in_n, out, out_n, count, root, op);
  } else {
    run_planned<C, Algo>(comm, in, in_n, out, out_n, count, root, op);
  }
}

} // namespace weft::detail

namespace weft {

/// Turns the call check on or off for the whole process (default: the WEFT_CHECK_CALLS
/// environment variable, on when set and not "0"). When on, before every collective the
/// ranks compare the operation, algorithm, count, element type, operator and root, and a
/// mismatch is a weft::error on every rank, raised before any data moves.
inline void check_calls(bool on) { detail::check_calls_flag().store(on); }

} // namespace weft
