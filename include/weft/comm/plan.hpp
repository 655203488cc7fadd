#pragma once
// The schedule IR. A collective algorithm does not move bytes: for one rank of one call it
// emits a plan, a list of steps over element ranges of three buffers (the caller's input
// and output, and a scratch buffer the plan sizes), addressed to peers. A transport runs a
// plan over real memory; the simulator prices it; tests run every rank's plan on a serial
// model. Plans count elements and never name the element type, so they are built once per
// key and shared by every type.
//
// Execution model, which every transport implements:
//   - Steps are grouped into rounds. At the start of a round the rank posts all of the
//     round's sends; then it runs the round's other steps in order; the round ends when
//     its receives are done and its sends have been consumed by their receivers. So the
//     source range of a send must stay unchanged until the round ends, and a round may
//     send and receive in both directions without deadlock.
//   - Messages between one pair of ranks match in order (MPI's non-overtaking rule).
//   - `load` and `load_reduce` read a peer's buffer directly (peer_access plans only).
//     A `sync` among the plan's group makes the peers' writes before it visible after it.
//     Peer-access plans start and end with a sync over every rank that reads from them,
//     except staged plans (plan::stage), whose peers read only their scratch: a staged plan's
//     scratch is a staging area the communicator keeps, in two copies that successive staged
//     calls alternate, so the next staged call's first sync, not a closing one, is what keeps
//     a rank from overwriting what a slower peer still reads. It saves small calls a sync.
//   - Reductions follow a fixed order, so all ranks get bitwise identical results.
#include <weft/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

enum class collective : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all
};

/// The largest scratch, in bytes, of a staged plan (the staging area every peer-access
/// transport keeps per rank, twice).
inline constexpr std::size_t max_staged_scratch_bytes = 16 * 1024;

constexpr std::string_view name_of(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::reduce: return "reduce";
    case collective::all_to_all: return "all_to_all";
  }
  return "?";
}

/// Whether a call of c takes a block of every rank as its input (count*p elements, in the
/// table below): reduce_scatter's and all_to_all's.
constexpr bool input_per_rank(collective c) noexcept {
  return c == collective::reduce_scatter || c == collective::all_to_all;
}

/// Whether a call of c gives a block of every rank as its output: all_gather's and
/// all_to_all's.
constexpr bool output_per_rank(collective c) noexcept {
  return c == collective::all_gather || c == collective::all_to_all;
}

/// Which buffer a step addresses. Buffer sizes, in elements, for a call of `count` on p ranks:
///   all_reduce       input count,     output count     (input may alias output: in place)
///   reduce_scatter   input count*p,   output count     (output = reduced block `rank`)
///   all_gather       input count,     output count*p   (block r of output = rank r's input)
///   broadcast        input = output,  output count     (root's output holds the data)
///   reduce           input count,     output count on the root, maybe empty elsewhere
///   all_to_all       input count*p,   output count*p   (output block s = rank s's input block
///                                                       `rank`)
enum class buffer : std::uint8_t { input, output, scratch };

enum class step_kind : std::uint8_t {
  send,        // send src[src_offset, +count) to peer
  recv,        // dst[dst_offset, +count) = message from peer
  recv_reduce, // dst[dst_offset + i] = src[src_offset + i] (op) message[i] from peer
  copy,        // dst[dst_offset + i] = src[src_offset + i]            (local)
  reduce,      // dst[dst_offset + i] = dst[dst_offset + i] (op) src[src_offset + i]   (local)
  load,        // dst[dst_offset + i] = peer's src[src_offset + i]      (peer access)
  load_reduce, // dst[dst_offset + i] = reduction over the ranks g of group `peer`, in the
               // group's order, of g's src[src_offset + i], accumulated in the op's
               // accumulation type and rounded once                   (peer access)
  sync,        // every rank of group `peer` reaches this point         (peer access)
};

constexpr std::string_view name_of(step_kind k) noexcept {
  switch (k) {
    case step_kind::send: return "send";
    case step_kind::recv: return "recv";
    case step_kind::recv_reduce: return "recv_reduce";
    case step_kind::copy: return "copy";
    case step_kind::reduce: return "reduce";
    case step_kind::load: return "load";
    case step_kind::load_reduce: return "load_reduce";
    case step_kind::sync: return "sync";
  }
  return "?";
}

struct step {
  step_kind kind = step_kind::copy;
  buffer src = buffer::input;
  buffer dst = buffer::output;
  int peer = -1; // a rank for send/recv/recv_reduce/load; a group index for load_reduce/sync
  std::size_t src_offset = 0;
  std::size_t dst_offset = 0;
  std::size_t count = 0;
  std::uint32_t round = 0;
};

/// What a plan is built for. `node_of[r]` is the node of rank r (empty: all on one node);
/// only topology-aware algorithms look at it.
struct plan_request {
  collective coll = collective::all_reduce;
  int size = 1;
  int rank = 0;
  std::size_t count = 0; // elements per rank, in the sense of the table above
  int root = 0;
  std::vector<int> node_of;
  std::size_t element_size = 4; // bytes; only size-dependent choices (protocols, pricing) read it

  friend bool operator==(const plan_request&, const plan_request&) = default;
};

/// One rank's steps for one call. Build with the helpers; each helper appends to the
/// current round; next_round() closes it (empty rounds are skipped).
class plan {
public:
  plan() = default;
  explicit plan(const plan_request& r)
      : coll_(r.coll), size_(r.size), rank_(r.rank), count_(r.count), root_(r.root) {}

  // --- building -----------------------------------------------------------------------
  void send(int peer, buffer src, std::size_t src_offset, std::size_t count) {
    push({step_kind::send, src, src, peer, src_offset, src_offset, count, round_});
  }
  void recv(int peer, buffer dst, std::size_t dst_offset, std::size_t count) {
    push({step_kind::recv, dst, dst, peer, dst_offset, dst_offset, count, round_});
  }
  void recv_reduce(int peer, buffer src, std::size_t src_offset, buffer dst, std::size_t dst_offset,
                   std::size_t count) {
    push({step_kind::recv_reduce, src, dst, peer, src_offset, dst_offset, count, round_});
  }
  void copy(buffer src, std::size_t src_offset, buffer dst, std::size_t dst_offset,
            std::size_t count) {
    push({step_kind::copy, src, dst, -1, src_offset, dst_offset, count, round_});
  }
  void reduce(buffer src, std::size_t src_offset, buffer dst, std::size_t dst_offset,
              std::size_t count) {
    push({step_kind::reduce, src, dst, -1, src_offset, dst_offset, count, round_});
  }
  void load(int peer, buffer src, std::size_t src_offset, buffer dst, std::size_t dst_offset,
            std::size_t count) {
    peer_access_ = true;
    push({step_kind::load, src, dst, peer, src_offset, dst_offset, count, round_});
  }
  void load_reduce(int group, buffer src, std::size_t src_offset, buffer dst,
                   std::size_t dst_offset, std::size_t count) {
    peer_access_ = true;
    push({step_kind::load_reduce, src, dst, group, src_offset, dst_offset, count, round_});
  }
  void sync(int group) {
    peer_access_ = true;
    next_round();
    steps_.push_back({step_kind::sync, buffer::scratch, buffer::scratch, group, 0, 0, 0, round_});
    ++round_;
  }
  /// Registers a group of ranks (for load_reduce and sync); returns its index.
  int add_group(std::vector<int> ranks) {
    groups_.push_back(std::move(ranks));
    return static_cast<int>(groups_.size() - 1);
  }
  void next_round() {
    if (!steps_.empty() && steps_.back().round == round_) {
      ++round_;
    }
  }
  /// The scratch buffer must hold at least n elements.
  void need_scratch(std::size_t n) { scratch_ = n > scratch_ ? n : scratch_; }
  /// Makes this plan staged (see the execution model above): its scratch is the transport's
  /// staging area, at most max_staged_scratch_bytes, and peers load only from their scratch,
  /// so it needs no closing sync.
  void stage() { staged_ = true; }
  /// Appends a plan made for a subgroup: its ranks map through rank_map, its buffers
  /// through buffer_map (offset added), and its rounds follow this plan's.
  struct buffer_binding {
    buffer to;
    std::size_t offset;
  };
  void append(const plan& sub, const std::vector<int>& rank_map, buffer_binding input,
              buffer_binding output, buffer_binding scratch) {
    next_round();
    const auto bind = [&](buffer b) -> const buffer_binding& {
      return b == buffer::input ? input : (b == buffer::output ? output : scratch);
    };
    std::vector<int> group_map;
    for (const auto& g : sub.groups_) {
      std::vector<int> mapped;
      for (int r : g)
        mapped.push_back(rank_map.at(static_cast<std::size_t>(r)));
      group_map.push_back(add_group(std::move(mapped)));
    }
    std::uint32_t base = round_;
    for (step s : sub.steps_) {
      const buffer_binding& sb = bind(s.src);
      const buffer_binding& db = bind(s.dst);
      s.src = sb.to;
      s.src_offset += sb.offset;
      s.dst = db.to;
      s.dst_offset += db.offset;
      if (s.kind == step_kind::load_reduce || s.kind == step_kind::sync) {
        s.peer = group_map.at(static_cast<std::size_t>(s.peer));
      } else if (s.peer >= 0) {
        s.peer = rank_map.at(static_cast<std::size_t>(s.peer));
      }
      s.round += base;
      round_ = s.round;
      steps_.push_back(s);
    }
    if (!sub.steps_.empty()) ++round_;
    // Inside a larger plan the staging area is ordinary scratch; the closing syncs the staged
    // sub-plan left out are added back.
    if (sub.staged_) {
      for (int g : group_map)
        sync(g);
    }
    peer_access_ = peer_access_ || sub.peer_access_;
    need_scratch(scratch.to == buffer::scratch ? scratch.offset + sub.scratch_ : 0);
  }

  // --- reading ------------------------------------------------------------------------
  [[nodiscard]] const std::vector<step>& steps() const noexcept { return steps_; }
  [[nodiscard]] const std::vector<int>& group(int g) const {
    return groups_.at(static_cast<std::size_t>(g));
  }
  [[nodiscard]] const std::vector<std::vector<int>>& groups() const noexcept { return groups_; }
  [[nodiscard]] std::size_t scratch_count() const noexcept { return scratch_; }
  [[nodiscard]] bool peer_access() const noexcept { return peer_access_; }
  [[nodiscard]] bool staged() const noexcept { return staged_; }
  [[nodiscard]] collective coll() const noexcept { return coll_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] int root() const noexcept { return root_; }
  [[nodiscard]] std::uint32_t rounds() const noexcept {
    return steps_.empty() ? 0 : steps_.back().round + 1;
  }

  /// Human-readable listing, for tests' failure messages and debugging.
  [[nodiscard]] std::string to_string() const {
    std::string s = std::string(name_of(coll_)) + " rank " + std::to_string(rank_) + "/" +
                    std::to_string(size_) + " count " + std::to_string(count_) + " scratch " +
                    std::to_string(scratch_) + (staged_ ? " (staged)" : "") + "\n";
    static constexpr const char* bufs[] = {"in", "out", "scr"};
    for (const step& st : steps_) {
      s += "  r" + std::to_string(st.round) + " " + std::string(name_of(st.kind));
      if (st.kind != step_kind::sync) {
        s += " " + std::string(bufs[static_cast<int>(st.src)]) + "[" +
             std::to_string(st.src_offset) + "] -> " + bufs[static_cast<int>(st.dst)] + "[" +
             std::to_string(st.dst_offset) + "] x" + std::to_string(st.count);
      }
      if (st.peer >= 0) s += " peer " + std::to_string(st.peer);
      s += "\n";
    }
    return s;
  }

private:
  void push(const step& s) {
    if (s.count > 0) steps_.push_back(s);
  }

  std::vector<step> steps_;
  std::vector<std::vector<int>> groups_;
  std::size_t scratch_ = 0;
  std::uint32_t round_ = 0;
  bool peer_access_ = false;
  bool staged_ = false;
  collective coll_ = collective::all_reduce;
  int size_ = 1;
  int rank_ = 0;
  std::size_t count_ = 0;
  int root_ = 0;
};

// --- running a plan -------------------------------------------------------------------
// Every executor (the transports, the serial model, the cost model) walks a plan with these:
// the rounds, and the one check of a step's range against its buffer.

/// Steps [begin, end) of a plan's steps: one round, numbered `number`.
struct plan_round {
  std::uint32_t number = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// One past the last step of the round that steps[begin] opens.
[[nodiscard]] inline std::size_t round_end(std::span<const step> steps,
                                           std::size_t begin) noexcept {
  std::size_t end = begin;
  while (end < steps.size() && steps[end].round == steps[begin].round)
    ++end;
  return end;
}

/// A plan's rounds in order: `for (const plan_round& r : rounds_of(pl.steps()))`.
class rounds_of {
public:
  explicit rounds_of(std::span<const step> steps) noexcept : steps_(steps) {}

  class iterator {
  public:
    iterator(std::span<const step> steps, std::size_t begin) noexcept : steps_(steps) { at(begin); }
    const plan_round& operator*() const noexcept { return round_; }
    const plan_round* operator->() const noexcept { return &round_; }
    iterator& operator++() noexcept {
      at(round_.end);
      return *this;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.round_.begin == b.round_.begin;
    }

  private:
    void at(std::size_t begin) noexcept {
      round_.begin = begin;
      round_.end = begin < steps_.size() ? round_end(steps_, begin) : begin;
      round_.number = begin < steps_.size() ? steps_[begin].round : 0;
    }
    std::span<const step> steps_;
    plan_round round_;
  };

  [[nodiscard]] iterator begin() const noexcept { return {steps_, 0}; }
  [[nodiscard]] iterator end() const noexcept { return {steps_, steps_.size()}; }

private:
  std::span<const step> steps_;
};

/// A rank's place in its plan, for the executors that interleave every rank's plan in one
/// thread (the serial model, the cost model): the execution model above as a state machine.
/// A closed round opens, posting its sends (open() returns them); current() is then each of
/// its other steps in order, next() moving past it, and nullptr once none is left, when the
/// round closes as soon as its sends have been consumed.
class plan_cursor {
public:
  plan_cursor() = default;
  explicit plan_cursor(std::span<const step> steps) noexcept : steps_(steps) {}

  /// Every round run and closed.
  [[nodiscard]] bool finished() const noexcept { return !open_ && pc_ >= steps_.size(); }
  [[nodiscard]] bool is_open() const noexcept { return open_; }
  /// Opens the next round (not finished(), not is_open()); returns its steps.
  plan_round open() noexcept {
    open_ = true;
    round_ = steps_[pc_].round;
    return {round_, pc_, round_end(steps_, pc_)};
  }
  /// The open round's next step that is not a send, or nullptr at the round's end.
  [[nodiscard]] const step* current() noexcept {
    while (pc_ < steps_.size() && steps_[pc_].round == round_ &&
           steps_[pc_].kind == step_kind::send)
      ++pc_;
    if (pc_ >= steps_.size() || steps_[pc_].round != round_) return nullptr;
    return &steps_[pc_];
  }
  void next() noexcept { ++pc_; }
  void close() noexcept { open_ = false; }
  /// current()'s index in the plan's steps (or one past the last step).
  [[nodiscard]] std::size_t index() const noexcept { return pc_; }

private:
  std::span<const step> steps_;
  std::size_t pc_ = 0;
  std::uint32_t round_ = 0;
  bool open_ = false;
};

/// Whether elements [offset, offset + count) lie inside a buffer of `size` elements (without
/// wrapping past SIZE_MAX): the one test of a step's range, on every executor.
[[nodiscard]] constexpr bool step_range_fits(std::size_t offset, std::size_t count,
                                             std::size_t size) noexcept {
  return offset <= size && count <= size - offset;
}

/// Throws weft::error unless step_range_fits(offset, count, size): how the transports check a
/// step's range.
inline void check_step_range(std::size_t offset, std::size_t count, std::size_t size,
                             std::string_view operation, int rank) {
  if (!step_range_fits(offset, count, size)) {
    throw error(operation, rank, error::unknown,
                "plan step addresses elements [" + std::to_string(offset) + ", " +
                    std::to_string(offset + count) + ") of a buffer of " + std::to_string(size));
  }
}

/// The three buffers one rank runs a plan over (indexed by `buffer`: input, output,
/// scratch) and their lengths in elements. at() checks a step's range and returns its first
/// element.
template <class T>
struct plan_buffers {
  T* base[3] = {};
  std::size_t size[3] = {};
  std::string_view operation;
  int rank = 0;

  [[nodiscard]] T* at(buffer b, std::size_t offset, std::size_t count) const {
    const auto i = static_cast<std::size_t>(b);
    check_step_range(offset, count, size[i], operation, rank);
    return base[i] + offset;
  }
};

} // namespace weft
