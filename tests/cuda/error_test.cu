// WEFT_CUDA_TRY and WEFT_NCCL_TRY, and device discovery: none of this needs a device, so it
// runs on the build machine too.
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/cuda/types.cuh>

#include <gtest/gtest.h>

#include <string>

namespace {

std::string message_of(void (*f)()) {
  try {
    f();
  } catch (const weft::error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(cuda_error, a_failed_runtime_call_names_the_call_the_place_and_the_error) {
  const std::string m = message_of([] { WEFT_CUDA_TRY(cudaErrorMemoryAllocation); });
  EXPECT_NE(m.find("cudaErrorMemoryAllocation failed at"), std::string::npos)
      << m; // the call's text
  EXPECT_NE(m.find("error_test.cu:"), std::string::npos) << m;
  EXPECT_NE(m.find("cudaErrorMemoryAllocation ("), std::string::npos)
      << m; // its name, then its description
  EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
}

TEST(cuda_error, a_failed_nccl_call_names_the_result) {
  const std::string m = message_of([] { WEFT_NCCL_TRY(ncclInvalidArgument); });
  EXPECT_NE(m.find("ncclInvalidArgument failed at"), std::string::npos) << m;
  EXPECT_NE(m.find(": ncclInvalidArgument ("), std::string::npos) << m;
  EXPECT_NE(m.find("invalid argument"), std::string::npos) << m;
}

TEST(cuda_error, success_throws_nothing) {
  EXPECT_NO_THROW(WEFT_CUDA_TRY(cudaSuccess));
  EXPECT_NO_THROW(WEFT_NCCL_TRY(ncclSuccess));
}

TEST(cuda_error, no_device_is_reported_not_thrown) {
  const int n = weft::cuda::device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(weft::cuda::no_device_reason().empty(), n > 0) << weft::cuda::no_device_reason();
}

TEST(cuda_types, weft_types_map_to_cuda_and_nccl_types) {
  static_assert(std::is_same_v<weft::cuda::device_type_t<weft::half>, __half>);
  static_assert(std::is_same_v<weft::cuda::device_type_t<weft::bfloat16>, __nv_bfloat16>);
  static_assert(std::is_same_v<weft::cuda::device_type_t<float>, float>);
  static_assert(weft::cuda::nccl_type_of<weft::half> == ncclFloat16);
  static_assert(weft::cuda::nccl_type_of<weft::bfloat16> == ncclBfloat16);
  static_assert(weft::cuda::nccl_type_of<std::int64_t> == ncclInt64);
  // Same bits on both sides: CUDA's own conversions agree with weft's for ordinary values.
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f, 3.14159f}) {
    const __half h = __float2half_rn(f);
    __half_raw raw = h;
    EXPECT_EQ(raw.x, weft::half(f).bits()) << f;
    const __nv_bfloat16 b = __float2bfloat16_rn(f);
    __nv_bfloat16_raw braw = b;
    EXPECT_EQ(braw.x, weft::bfloat16(f).bits()) << f;
  }
}

} // namespace
