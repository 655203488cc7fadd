#pragma once
// The call check: before a collective runs, the ranks compare fingerprints of their calls
// (operation, algorithm, count, element type, operator, root), and a mismatch is a
// weft::error on every rank, raised before any of the call's data moves.
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/detail/fnv1a.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace weft::detail {

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
      for (int shift = 28; shift >= 0; shift -= 4)
        s += hex[(h >> shift) & 0xf];
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
  return std::string(name_of(s.coll)) + "<" + std::string(s.algorithm) + "> of " +
         std::to_string(s.count) + " x " + std::string(name_of(s.type)) + ", op " +
         std::string(s.op) + ", root " + std::to_string(s.root);
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
  std::int64_t mine[words] = {
      static_cast<std::int64_t>(sig.coll),      static_cast<std::int64_t>(fnv1a(sig.algorithm)),
      static_cast<std::int64_t>(sig.count),     static_cast<std::int64_t>(sig.type),
      static_cast<std::int64_t>(fnv1a(sig.op)), sig.root};
  pack_name(sig.algorithm, mine + fields, 4);
  pack_name(sig.op, mine + fields + 4, 2);
  std::vector<std::int64_t> table(words * static_cast<std::size_t>(p));
  if (comm.rank() == 0) {
    std::copy(mine, mine + words, table.begin());
    for (int r = 1; r < p; ++r) {
      comm.recv(std::span<std::int64_t>(table.data() + words * static_cast<std::size_t>(r), words),
                r, tag);
    }
    for (int r = 1; r < p; ++r)
      comm.send(std::span<const std::int64_t>(table), r, tag);
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
        static constexpr const char* what[] = {"collective", "algorithm", "count",
                                               "type",       "op",        "root"};
        how += how.empty() ? " in " : ", ";
        how += what[w];
      }
    }
    if (how.empty()) {
      agree.push_back(r);
    } else {
      diff += "; rank " + std::to_string(r) + " differs from rank 0" + how + ": it called " +
              describe_row(row);
    }
  }
  if (!diff.empty()) {
    std::string same = agree.size() == 1 ? "rank 0" : "ranks";
    if (agree.size() > 1) {
      for (std::size_t i = 0; i < agree.size(); ++i)
        same += (i == 0 ? " " : ",") + std::to_string(agree[i]);
    }
    const error mismatch(
        name_of(sig.coll), comm.rank(), error::unknown,
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

} // namespace weft::detail
