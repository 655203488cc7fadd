#pragma once
// Each rank's cache of plans: a plan depends only on its algorithm and request, so a rank
// builds it once and reuses it for every call of the same shape.
#include <weft/comm/plan.hpp>

#include <cstddef>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace weft::detail {

/// A rank's plans, by algorithm and request. Plans depend only on their key, so one cache
/// per thread (a rank of the local transport, or an MPI process) is enough.
class plan_cache {
public:
  template <class Make>
  const plan& get(std::string_view algorithm, const plan_request& q, Make&& make) {
    key k{algorithm, q};
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= max_entries)
      plans_.clear(); // a bound, for programs with many distinct sizes
    return plans_.emplace(std::move(k), make(q)).first->second;
  }
  static plan_cache& mine() {
    thread_local plan_cache cache;
    return cache;
  }

private:
  static constexpr std::size_t max_entries = 1024;
  struct key {
    std::string_view algorithm; // names are static strings
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
      for (int n : k.request.node_of)
        mix(static_cast<std::size_t>(n));
      return h;
    }
  };
  std::unordered_map<key, plan, hash> plans_;
};

} // namespace weft::detail
