#pragma once
// Host working memory for weft::two_level's calls, kept between calls.
#include <weft/core/error.hpp>

#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace weft::detail {

/// Host working memory kept between calls, as a caching allocator keeps device memory: a call's
/// scratch is taken from blocks freed by earlier calls where one is big enough, so large
/// buffers are not mapped and faulted in afresh each call. Held until the two_level goes.
class scratch_pool {
public:
  using block = std::unique_ptr<std::max_align_t[]>;
  struct slab {
    block mem;
    std::size_t bytes = 0;
  };
  /// A block of at least `bytes`: the smallest free one that fits, else a new one.
  slab take(std::size_t bytes) {
    {
      const std::lock_guard lock(m_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
      }
      if (best != free_.end()) {
        slab s = std::move(*best);
        free_.erase(best);
        return s;
      }
    }
    if (bytes > std::numeric_limits<std::size_t>::max() - sizeof(std::max_align_t)) {
      throw error("two_level: working memory of " + std::to_string(bytes) + " bytes");
    }
    const std::size_t units = (bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
    return {std::make_unique_for_overwrite<std::max_align_t[]>(units),
            units * sizeof(std::max_align_t)};
  }
  void give(slab s) {
    const std::lock_guard lock(m_);
    free_.push_back(std::move(s));
  }

private:
  std::mutex m_;
  std::vector<slab> free_;
};

/// n uninitialized elements of T from a scratch_pool, given back when this goes.
template <class T>
class host_scratch {
public:
  host_scratch(std::shared_ptr<scratch_pool> pool, std::size_t n) : pool_(std::move(pool)) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw error("two_level: working memory of " + std::to_string(n) + " elements");
    }
    if (n != 0) s_ = pool_->take(n * sizeof(T));
  }
  host_scratch(host_scratch&&) noexcept = default;
  host_scratch& operator=(host_scratch&&) = delete;
  host_scratch(const host_scratch&) = delete;
  host_scratch& operator=(const host_scratch&) = delete;
  ~host_scratch() {
    if (s_.mem) pool_->give(std::move(s_));
  }
  [[nodiscard]] T* data() const noexcept { return reinterpret_cast<T*>(s_.mem.get()); }

private:
  std::shared_ptr<scratch_pool> pool_;
  scratch_pool::slab s_;
};

} // namespace weft::detail
