#pragma once
// executor<Schedule, Comm>: one training step of a pipeline schedule over a communicator, with
// the user's stage functions. Rank r of the communicator is stage r and runs its action list
// (schedule.hpp) in order. One microbatch i through p = 2 stages, one chunk each:
//
//   rank 0 (virtual stage 0)                 rank 1 (virtual stage 1, the last)
//   x  = input(i)
//   a  = forward(i, 0, x)    --- a --->      y = forward(i, 0, a)
//                                            (loss, gy) = loss(i, y)
//   backward(i, 0, ga)       <--- ga ---     ga = backward(i, 0, gy)
//   weight_grad(i, 0)                        weight_grad(i, 0)
//
// The stage object (any type; run() names what it lacks at compile time):
//   input(i)                  the first virtual stage's input for microbatch i: a slice of
//                             the batch (see microbatch()); called on rank 0 only
//   forward(i, chunk, in)     the chunk's output activations for input `in`
//   loss(i, out)              last virtual stage only: {loss, gradient of out} (loss_result)
//   backward(i, chunk, gout)  the gradient of the chunk's input, from that of its output; the
//                             first virtual stage's is discarded (it may be empty)
//   weight_grad(i, chunk)     the weight gradient (W). Needed when the schedule splits the
//                             backward (zb-h1); otherwise, if present, called right after B.
// Results are std::vector<T> (moved, not copied) or anything a std::span<const T> can view
// (copied at once, so the view need only outlive the call; it may view the call's argument).
// What crosses stage boundaries must have the size given per boundary at construction; layers
// per stage are the stage functions' business.
//
// Communication. Each send sits right after the action that made its message and each receive
// right before the one that needs it (from_compute_order), so a message leaves as soon as it
// exists and is waited for as late as possible. What overlaps then depends on the transport:
//   weft::local  a send copies the message into the channel and returns; the receiver copies
//                it out when it needs it. A stage never waits for its consumer (up to 64 queued
//                messages per peer), so each rank computes while its neighbours are busy or
//                idle; the copies themselves run on the ranks' own threads, not beside them.
//   weft::mpi    a send is mpi::communicator::post: the message is copied and MPI_Isend
//                started, and the rank goes on at once whatever the size (a blocking send
//                would deadlock 1F1B's steady state, where both neighbours send before they
//                receive, as soon as a message passes MPI's eager limit). run() ends with
//                flush(), so a step returns only when its messages have been delivered.
// A communicator with post() (buffered send) gets it; one without gets send().
// Messages carry schedule::message_tag. A rank receives each peer's messages in the order the
// peer sent them (weft::local delivers them so): when the schedule wants a message that the
// peer sent after others not yet received here, those are received first and kept for their
// turn.
//
// Errors: weft::error naming the schedule, the rank, the action and its microbatch, for a
// stage function that throws, a tensor of the wrong size, or a failed send or receive (with
// the peer). After one, the step is abandoned and the communicator's messages are in an
// unknown state, as after any failed communication.
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/validate.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::pipeline {

/// A generator policy: gpipe, one_f_one_b, interleaved<V>, zero_bubble_h1 or the user's own.
template <class S>
concept schedule_policy = requires(int n, const options& o) {
  { S::make(n, n, o) } -> std::same_as<schedule>;
  { S::split_backward } -> std::convertible_to<bool>;
};

/// A communicator with point-to-point messages of T: weft::local, weft::mpi.
template <class C, class T>
concept point_to_point = communicator<C> &&
    requires(C& c, std::span<const T> out, std::span<T> in, int peer, int tag) {
  c.send(out, peer, tag);
  c.recv(in, peer, tag);
};

/// What a loss function returns: the microbatch's loss and the gradient of the last virtual
/// stage's output.
template <class T>
struct loss_result {
  double loss = 0;
  std::vector<T> gradient;
};

/// Microbatch i of m equal parts of `batch`, a whole number of samples of `sample_size`
/// elements each. Throws weft::error unless m divides the samples.
template <class T>
std::span<T> microbatch(std::span<T> batch, std::size_t sample_size, int microbatches, int i) {
  const auto fail = [&](const std::string& what) {
    throw error("weft: pipeline::microbatch: " + what);
  };
  if (sample_size == 0 || batch.size() % sample_size != 0) {
    fail("a batch of " + std::to_string(batch.size()) +
         " elements is no whole number of samples of " + std::to_string(sample_size));
  }
  const std::size_t samples = batch.size() / sample_size;
  if (microbatches < 1 || samples % static_cast<std::size_t>(microbatches) != 0) {
    fail(std::to_string(samples) + " samples do not split into " + std::to_string(microbatches) +
         " equal microbatches");
  }
  if (i < 0 || i >= microbatches) {
    fail("microbatch " + std::to_string(i) + " is outside [0, " + std::to_string(microbatches) +
         ")");
  }
  const std::size_t n = samples / static_cast<std::size_t>(microbatches) * sample_size;
  return batch.subspan(static_cast<std::size_t>(i) * n, n);
}

namespace detail {

/// Where sends block once `capacity` messages to a peer wait unreceived (weft::local's
/// channels), a schedule validate() accepts (it lets sends complete at once) can still stall:
/// a rank that sends more than that to a peer before the peer receives the first of them. Plays
/// the step with bounded channels, each receive taking the peer's messages in their order up to
/// the one it wants (as executor::run does), and returns "" or what stalls. The outcome does not
/// depend on timing: an enabled send or receive stays enabled until its rank takes it.
inline std::string stalls_with_bounded_channels(const schedule& s, std::size_t capacity) {
  const auto p = static_cast<std::size_t>(s.stages);
  // Each message (a tag, sent once in the step): its place among its sender's messages to its
  // receiver.
  constexpr std::size_t unsent = ~std::size_t{0};
  const std::size_t tags =
      2 * static_cast<std::size_t>(s.microbatches) * static_cast<std::size_t>(s.virtual_stages());
  std::vector<std::size_t> position(tags, unsent);
  {
    std::vector<std::size_t> so_far(p * p, 0);
    for (std::size_t r = 0; r < p; ++r) {
      for (const action& a : s.ranks[r]) {
        if (is_send(a.kind))
          position[s.message_tag(static_cast<int>(r), a)] =
              so_far[r * p + static_cast<std::size_t>(a.peer)]++;
      }
    }
  }
  std::vector<std::size_t> sent(p * p, 0), received(p * p, 0), pc(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < p; ++r) {
      for (; pc[r] < s.ranks[r].size(); ++pc[r]) {
        const action& a = s.ranks[r][pc[r]];
        if (is_compute(a.kind)) continue;
        const auto peer = static_cast<std::size_t>(a.peer);
        if (is_send(a.kind)) {
          const std::size_t pair = r * p + peer;
          if (sent[pair] - received[pair] >= capacity) break;
          ++sent[pair];
        } else {
          const std::size_t pair = peer * p + r;
          const std::size_t want = position[s.message_tag(static_cast<int>(r), a)];
          if (want == unsent) break; // validate() reports that
          while (received[pair] <= want && received[pair] < sent[pair]) {
            ++received[pair];
            progress = true;
          }
          if (received[pair] <= want) break;
        }
        progress = true;
      }
    }
  }
  std::string stalled;
  for (std::size_t r = 0; r < p; ++r) {
    if (pc[r] == s.ranks[r].size()) continue;
    const action& a = s.ranks[r][pc[r]];
    const auto peer = static_cast<std::size_t>(a.peer);
    stalled +=
        (stalled.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " at " +
        token(a) +
        (is_send(a.kind) ? " with " + std::to_string(sent[r * p + peer] - received[r * p + peer]) +
                               " messages to rank " + std::to_string(peer) + " unreceived"
                         : "");
  }
  return stalled;
}

} // namespace detail

template <schedule_policy Schedule, class Comm, element T = float>
requires point_to_point<Comm, T>
class executor {
public:
  /// The schedule of `microbatches` over comm's ranks, validated. boundaries[v]: the elements
  /// per microbatch that virtual stage v hands to v + 1 (its output; the gradient going back
  /// has the same size), one for each of the V * p - 1 boundaries. `comm` must outlive the
  /// executor; each rank constructs its own.
  executor(Comm& comm, int microbatches, std::vector<std::size_t> boundaries, const options& o = {})
      : executor(comm, microbatches, std::move(boundaries), false, o) {}

  /// The same size at every boundary.
  executor(Comm& comm, int microbatches, std::size_t boundary, const options& o = {})
      : executor(comm, microbatches, {boundary}, true, o) {}

  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  executor(executor&&) noexcept = default;
  executor& operator=(executor&&) noexcept = default;
  ~executor() = default;

  [[nodiscard]] const pipeline::schedule& schedule() const noexcept { return s_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Whether this rank runs the last virtual stage, and so the loss.
  [[nodiscard]] bool has_loss() const noexcept { return s_.rank_of(last()) == rank_; }

  /// Runs one step: every microbatch forward and backward through this rank's chunks. Returns
  /// the loss of each microbatch on the rank of the last virtual stage, nothing elsewhere.
  template <class Stage>
  std::vector<double> run(Stage& stage) {
    using view = std::span<const T>;
    static_assert(
        requires(Stage & st, view x) { view(st.forward(0, 0, x)); },
        "weft::pipeline::executor: the stage needs forward(int microbatch, int chunk, "
        "std::span<const T> input) returning the output (std::vector<T>, or a range "
        "a std::span<const T> can view)");
    static_assert(
        requires(Stage & st, view x) { view(st.backward(0, 0, x)); },
        "weft::pipeline::executor: the stage needs backward(int microbatch, int chunk, "
        "std::span<const T> output_gradient) returning the input gradient");
    static_assert(
        requires(Stage & st) { view(st.input(0)); },
        "weft::pipeline::executor: the stage needs input(int microbatch) returning the "
        "first virtual stage's input");
    static_assert(
        requires(Stage & st, view y) {
          { st.loss(0, y).loss } -> std::convertible_to<double>;
          view(st.loss(0, y).gradient);
        },
        "weft::pipeline::executor: the stage needs loss(int microbatch, std::span<const T> "
        "output) returning {loss, gradient of output}, e.g. a weft::pipeline::loss_result<T>");
    static_assert(!Schedule::split_backward || has_weight_grad<Stage>,
                  "weft::pipeline::executor: this schedule splits the backward into B and W: the "
                  "stage needs weight_grad(int microbatch, int chunk)");
    std::vector<double> losses(has_loss() ? static_cast<std::size_t>(s_.microbatches) : 0);
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      const resolved& o = ops_[i];
      switch (o.a.kind) {
        case action_kind::forward: forward(stage, i, losses); break;
        case action_kind::backward:
          backward(stage, i);
          if constexpr (has_weight_grad<Stage>) {
            if (!s_.split_backward)
              call(i, "weight_grad", [&] { stage.weight_grad(o.a.microbatch, o.a.chunk); });
          }
          break;
        case action_kind::weight:
          if constexpr (has_weight_grad<Stage>) {
            call(i, "weight_grad", [&] { stage.weight_grad(o.a.microbatch, o.a.chunk); });
          }
          break;
        case action_kind::send_activation:
        case action_kind::send_gradient:
          transfer(i, [&] {
            if constexpr (requires { comm_->post(view(boxes_[o.in]), o.a.peer, o.tag); }) {
              comm_->post(view(boxes_[o.in]), o.a.peer, o.tag);
            } else {
              comm_->send(view(boxes_[o.in]), o.a.peer, o.tag);
            }
          });
          release(o.in);
          break;
        case action_kind::recv_activation:
        case action_kind::recv_gradient:
          for (std::size_t k = o.pulls_begin; k < o.pulls_end; ++k) {
            const pull& m = pulls_[k];
            std::vector<T>& box = boxes_[m.box];
            box = take();
            box.resize(m.count);
            transfer(i, [&] { comm_->recv(std::span<T>(box), o.a.peer, m.tag); });
          }
          break;
      }
    }
    if constexpr (requires { comm_->flush(); }) comm_->flush();
    return losses;
  }

private:
  static constexpr std::uint32_t none = ~std::uint32_t{0};

  template <class Stage>
  static constexpr bool has_weight_grad = requires(Stage& st) {
    st.weight_grad(0, 0);
  };

  // One action of this rank with what it touches, resolved once: the boxes (one per message,
  // loss gradient included) it reads and writes, and the sizes it expects.
  struct resolved {
    action a;
    std::uint32_t in = none;  // F: input (none: input()); B: output gradient; send: message
    std::uint32_t out = none; // F: output, or the loss gradient; B: input gradient (none: drop)
    std::size_t count = 0;    // F, B: the output's elements (unchecked on the last F)
    int tag = 0;              // send: message_tag
    std::uint32_t pulls_begin = 0; // recv: the messages to receive, pulls_[begin, end)
    std::uint32_t pulls_end = 0;
  };
  // A message received from a peer, in the peer's order.
  struct pull {
    std::uint32_t box;
    int tag;
    std::size_t count;
  };

  executor(Comm& comm, int microbatches, std::vector<std::size_t> boundaries, bool uniform,
           const options& o)
      : comm_(&comm),
        rank_(comm.rank()),
        s_(Schedule::make(comm.size(), microbatches, o)),
        operation_("pipeline::executor " + s_.name),
        boundaries_(std::move(boundaries)) {
    if (s_.stages != comm.size()) {
      throw error(operation_, rank_, error::unknown,
                  "the generator made a schedule of " + std::to_string(s_.stages) +
                      " stages for a communicator of " + std::to_string(comm.size()) + " ranks");
    }
    if (s_.microbatches != microbatches) {
      throw error(operation_, rank_, error::unknown,
                  "the generator made a schedule of " + std::to_string(s_.microbatches) +
                      " microbatches where " + std::to_string(microbatches) + " were asked for");
    }
    if (s_.split_backward != Schedule::split_backward) {
      throw error(operation_, rank_, error::unknown,
                  std::string("the generator's split_backward says ") +
                      (Schedule::split_backward ? "true" : "false") +
                      ", but the schedule it made says otherwise");
    }
    validate(s_);
    // A transport whose sends block on a full channel (weft::local without post()) would stall
    // where the schedule queues more messages to a peer than the channel holds: say so now.
    if constexpr (
        !requires(Comm & c, std::span<const T> v) { c.post(v, 0, 0); } &&
        requires { Comm::queued_messages_per_peer; }) {
      const std::size_t capacity = Comm::queued_messages_per_peer;
      if (const std::string stall = detail::stalls_with_bounded_channels(s_, capacity);
          !stall.empty()) {
        throw error(
            operation_, rank_, error::unknown,
            "the schedule queues more than " + std::to_string(capacity) +
                " messages to a peer, which this transport's sends do not hold (they would wait "
                "for ever): " +
                stall +
                ". A smaller microbatch group (options::group_size), or "
                "a transport with buffered sends (weft::mpi), runs it");
      }
    }
    const auto bounds = static_cast<std::size_t>(s_.virtual_stages() - 1);
    if (uniform) boundaries_.assign(bounds, boundaries_.front());
    if (boundaries_.size() != bounds) {
      throw error(operation_, rank_, error::unknown,
                  "needs the size of each of the " + std::to_string(bounds) +
                      " boundaries between its " + std::to_string(s_.virtual_stages()) +
                      " virtual stages (" + std::to_string(s_.stages) + " stages x " +
                      std::to_string(s_.chunks) + " chunks), not " +
                      std::to_string(boundaries_.size()));
    }
    resolve();
  }

  [[nodiscard]] int last() const noexcept { return s_.virtual_stages() - 1; }

  // The box of microbatch mb's activation made by virtual stage v, or (gradient) of the
  // gradient of v's input, made by v's B; v = V p holds the loss gradient, the gradient of the
  // last virtual stage's output.
  [[nodiscard]] std::uint32_t box(int mb, int v, bool gradient) const noexcept {
    const auto slots = static_cast<std::size_t>(s_.virtual_stages() + 1);
    return static_cast<std::uint32_t>(
        (static_cast<std::size_t>(mb) * slots + static_cast<std::size_t>(v)) * 2 +
        (gradient ? 1 : 0));
  }

  // The elements that cross the boundary after virtual stage v.
  [[nodiscard]] std::size_t boundary(int v) const {
    return boundaries_[static_cast<std::size_t>(v)];
  }

  void resolve() {
    boxes_.resize(box(s_.microbatches, 0, false));
    // Each peer's messages to this rank, in the order it sends them.
    const auto p = static_cast<std::size_t>(s_.stages);
    std::vector<std::vector<pull>> from(p);
    for (std::size_t q = 0; q < p; ++q) {
      for (const action& a : s_.ranks[q]) {
        if (!is_send(a.kind) || a.peer != rank_) continue;
        const int v = s_.virtual_stage(static_cast<int>(q), a.chunk);
        const bool grad = a.kind == action_kind::send_gradient;
        from[q].push_back(pull{box(a.microbatch, v, grad),
                               static_cast<int>(s_.message_tag(static_cast<int>(q), a)),
                               grad ? boundary(v - 1) : boundary(v)});
      }
    }
    std::vector<std::size_t> next(p, 0);        // the next message to pull from each peer
    std::vector<char> pulled(boxes_.size(), 0); // received, perhaps ahead of its turn
    // Boxes full at once: how many spare vectors are worth keeping.
    std::size_t live = 0;
    const auto fill = [&] { peak_live_ = std::max(peak_live_, ++live); };
    const auto empty = [&] { --live; };
    for (const action& a : s_.ranks[static_cast<std::size_t>(rank_)]) {
      resolved o{a};
      const int mb = a.microbatch;
      const int v = s_.virtual_stage(rank_, a.chunk);
      switch (a.kind) {
        case action_kind::forward:
          if (v > 0) o.in = box(mb, v - 1, false);
          if (v < last()) {
            o.out = box(mb, v, false);
            o.count = boundary(v);
          } else {
            o.out = box(mb, last() + 1, true);
          }
          fill();
          if (v > 0) empty();
          break;
        case action_kind::backward:
          o.in = box(mb, v + 1, true);
          if (v > 0) {
            o.out = box(mb, v, true);
            o.count = boundary(v - 1);
            fill();
          }
          empty();
          break;
        case action_kind::weight: break;
        case action_kind::send_activation:
        case action_kind::send_gradient:
          o.in = box(mb, v, a.kind == action_kind::send_gradient);
          o.tag = static_cast<int>(s_.message_tag(rank_, a));
          empty();
          break;
        case action_kind::recv_activation:
        case action_kind::recv_gradient: {
          const bool grad = a.kind == action_kind::recv_gradient;
          const std::uint32_t want = box(mb, grad ? v + 1 : v - 1, grad);
          const auto peer = static_cast<std::size_t>(a.peer);
          o.pulls_begin = static_cast<std::uint32_t>(pulls_.size());
          while (!pulled[want] && next[peer] < from[peer].size()) {
            const pull& m = from[peer][next[peer]++];
            pulled[m.box] = 1;
            pulls_.push_back(m);
            fill();
          }
          o.pulls_end = static_cast<std::uint32_t>(pulls_.size());
          break;
        }
      }
      ops_.push_back(o);
    }
  }

  // A spare vector for a box (empty, perhaps with capacity from an earlier message).
  std::vector<T> take() {
    if (spare_.empty()) return {};
    std::vector<T> v = std::move(spare_.back());
    spare_.pop_back();
    v.clear();
    return v;
  }
  // Empties a box; its storage serves a later one. No more spares are kept than boxes are ever
  // full at once, so a rank holds the storage of its in-flight messages, not of the step's.
  void release(std::uint32_t b) {
    std::vector<T>& v = boxes_[b];
    if (spare_.size() < peak_live_ && v.capacity() > 0) spare_.push_back(std::move(v));
    v = std::vector<T>();
  }
  // Puts a stage function's result into box b: a std::vector<T> rvalue is moved, anything
  // else copied.
  template <class R>
  void store(std::uint32_t b, R&& result) {
    if constexpr (std::is_same_v<std::remove_cvref_t<R>, std::vector<T>> &&
                  !std::is_lvalue_reference_v<R>) {
      boxes_[b] = std::move(result);
    } else {
      const std::span<const T> view(result);
      std::vector<T> v = take();
      v.assign(view.begin(), view.end());
      boxes_[b] = std::move(v);
    }
  }

  // An F's input (from input(), or its box) outlives the output, which may view it; the box
  // is emptied once the output is stored.
  template <class Stage>
  void forward(Stage& stage, std::size_t i, std::vector<double>& losses) {
    const resolved& o = ops_[i];
    const int mb = o.a.microbatch;
    if (o.in == none) {
      decltype(auto) x = call(i, "input", [&]() -> decltype(auto) { return stage.input(mb); });
      decltype(auto) y = call(i, "forward", [&]() -> decltype(auto) {
        return stage.forward(mb, o.a.chunk, std::span<const T>(x));
      });
      output(stage, i, std::forward<decltype(y)>(y), losses);
      return;
    }
    decltype(auto) y = call(i, "forward", [&]() -> decltype(auto) {
      return stage.forward(mb, o.a.chunk, std::span<const T>(boxes_[o.in]));
    });
    output(stage, i, std::forward<decltype(y)>(y), losses);
    release(o.in);
  }

  // Stores F's output y for the next virtual stage or, on the last, its loss gradient.
  template <class Stage, class Y>
  void output(Stage& stage, std::size_t i, Y&& y, std::vector<double>& losses) {
    const resolved& o = ops_[i];
    const int v = s_.virtual_stage(rank_, o.a.chunk);
    const std::span<const T> out(y);
    if (v < last()) {
      expect_size(i, "forward", out.size(), o.count,
                  "the boundary to virtual stage " + std::to_string(v + 1) + " carries");
      store(o.out, std::forward<Y>(y));
      return;
    }
    const int mb = o.a.microbatch;
    decltype(auto) l = call(i, "loss", [&]() -> decltype(auto) { return stage.loss(mb, out); });
    losses[static_cast<std::size_t>(mb)] = static_cast<double>(l.loss);
    expect_size(i, "loss", std::span<const T>(l.gradient).size(), out.size(),
                "the gradient of the output has the output's");
    if constexpr (std::is_lvalue_reference_v<decltype(l)>) {
      store(o.out, l.gradient);
    } else {
      store(o.out, std::move(l.gradient));
    }
  }

  template <class Stage>
  void backward(Stage& stage, std::size_t i) {
    const resolved& o = ops_[i];
    const int v = s_.virtual_stage(rank_, o.a.chunk);
    decltype(auto) g = call(i, "backward", [&]() -> decltype(auto) {
      return stage.backward(o.a.microbatch, o.a.chunk, std::span<const T>(boxes_[o.in]));
    });
    if (o.out != none) { // the first virtual stage's input gradient goes nowhere
      expect_size(i, "backward", std::span<const T>(g).size(), o.count,
                  "the boundary back to virtual stage " + std::to_string(v - 1) + " carries");
      store(o.out, std::forward<decltype(g)>(g));
    }
    release(o.in);
  }

  // "action 7 (F3.1), microbatch 3"
  [[nodiscard]] std::string where(std::size_t i) const {
    const action& a = ops_[i].a;
    return "action " + std::to_string(i) + " (" + token(a) + "), microbatch " +
           std::to_string(a.microbatch);
  }

  void expect_size(std::size_t i, std::string_view what, std::size_t got, std::size_t want,
                   const std::string& of) const {
    if (got == want) return;
    throw error(operation_, rank_, error::unknown,
                where(i) + ": " + std::string(what) + " returned " + std::to_string(got) +
                    " elements, but " + of + " " + std::to_string(want));
  }

  // Runs a stage function; whatever it throws becomes a weft::error naming the action.
  template <class F>
  decltype(auto) call(std::size_t i, std::string_view what, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      throw error(operation_, rank_, error::unknown,
                  where(i) + ": " + std::string(what) + " threw: " + e.what());
    } catch (...) {
      throw error(operation_, rank_, error::unknown,
                  where(i) + ": " + std::string(what) + " threw something not a std::exception");
    }
  }

  // Runs a send or receive; its failure becomes a weft::error naming the action and the peer.
  template <class F>
  void transfer(std::size_t i, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw error(operation_, rank_, ops_[i].a.peer, where(i) + ": " + e.what());
    }
  }

  Comm* comm_;
  int rank_;
  pipeline::schedule s_;
  std::string operation_;
  std::vector<std::size_t> boundaries_;
  std::vector<resolved> ops_;
  std::vector<pull> pulls_;
  std::vector<std::vector<T>> boxes_; // indexed by box()
  std::vector<std::vector<T>> spare_;
  std::size_t peak_live_ = 0;
};

} // namespace weft::pipeline
