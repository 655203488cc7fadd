#pragma once
// A growable buffer for a transport's scratch: aligned for any element type, reused across
// calls, grown (never shrunk) to the largest request.
#include <cstddef>
#include <vector>

namespace weft::detail {

class scratch_buffer {
public:
  /// Room for n elements of T; the contents are unspecified.
  template <class T>
  T* get(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (words_.size() * sizeof(word) < bytes) words_.resize(bytes / sizeof(word) + 1);
    return reinterpret_cast<T*>(words_.data());
  }

private:
  // Not std::max_align_t itself: nvcc's front end (CUDA 13, libstdc++ 12) fails an internal
  // assertion on std::vector<std::max_align_t>, and these headers must compile in .cu files.
  struct alignas(alignof(std::max_align_t)) word {
    unsigned char bytes[alignof(std::max_align_t)];
  };
  std::vector<word> words_;
};

} // namespace weft::detail
