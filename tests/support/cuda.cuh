#pragma once
// For GPU tests: skip (visibly, with the reason) where no CUDA device is present.
#include <weft/cuda/memory.cuh>

#include <gtest/gtest.h>

#define WEFT_REQUIRE_DEVICE()                                                                      \
  do {                                                                                             \
    if (const std::string weft_reason_ = ::weft::cuda::no_device_reason();                         \
        !weft_reason_.empty()) {                                                                   \
      GTEST_SKIP() << weft_reason_;                                                                \
    }                                                                                              \
  } while (false)
