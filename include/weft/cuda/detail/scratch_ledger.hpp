#pragma once
// The bookkeeping of device scratch that grows (detail/stream_memory.cuh): which block is
// current, and which superseded blocks must stay allocated because a CUDA graph captured a call
// that uses them. Host logic only: the owner allocates and frees what this says.
//
// A graph holds the addresses its captured kernels and NCCL calls were given; replaying it
// after the block they point into was freed reads and writes freed memory. So a block that a
// captured call used is not freed when a later, larger call outside any capture grows the
// scratch: it is retired, and freed only when the owner is told that no graph uses it any more or
// when the owner goes. A block no capture used is freed at once.
//
//   fits(bytes, capturing)   a call's need: true where the current block holds it (a captured
//                            call marks the block as in a graph's hands)
//   replace(new)             the grown block becomes current; returns the old one to free now,
//                            or keeps it among the retired ones (returning an empty block)
//   take_retired()           the retired blocks, to free once their graphs are gone
//   take_current()           the current block (the owner's end)
#include <cstddef>
#include <utility>
#include <vector>

namespace weft::cuda::detail {

class scratch_ledger {
public:
  struct block {
    void* p = nullptr;
    std::size_t bytes = 0;
    friend bool operator==(const block&, const block&) = default;
  };

  [[nodiscard]] const block& current() const noexcept { return current_; }
  /// Whether a captured call has used the current block.
  [[nodiscard]] bool current_captured() const noexcept { return captured_; }
  /// Superseded blocks that a graph may still use.
  [[nodiscard]] const std::vector<block>& retired() const noexcept { return retired_; }
  [[nodiscard]] std::size_t retired_bytes() const noexcept {
    std::size_t n = 0;
    for (const block& b : retired_)
      n += b.bytes;
    return n;
  }

  /// Whether the current block holds `bytes`; where it does and a call being captured into a
  /// graph uses it (bytes > 0), the block is marked as the graph's for as long as the graph lives.
  bool fits(std::size_t bytes, bool capturing) noexcept {
    if (bytes > current_.bytes) return false;
    if (capturing && bytes != 0) captured_ = true;
    return true;
  }

  /// Makes `grown` the current block. Returns the one it supersedes for the caller to free (after
  /// the work queued so far), or an empty block where a captured call used it: then it is
  /// retired, kept until take_retired().
  [[nodiscard]] block replace(block grown) {
    if (current_.p != nullptr && captured_) retired_.reserve(retired_.size() + 1);
    block old = std::exchange(current_, grown);
    if (old.p != nullptr && std::exchange(captured_, false)) {
      retired_.push_back(old); // cannot throw: reserved above
      return {};
    }
    return old;
  }

  /// The retired blocks, no longer kept here: free them once no graph that captured a call on
  /// them is launched again.
  [[nodiscard]] std::vector<block> take_retired() noexcept { return std::exchange(retired_, {}); }

  /// The current block, no longer kept here (the owner's end, with take_retired()).
  [[nodiscard]] block take_current() noexcept {
    captured_ = false;
    return std::exchange(current_, {});
  }

private:
  block current_;
  bool captured_ = false;
  std::vector<block> retired_;
};

} // namespace weft::cuda::detail
