#pragma once
// Float products and sums rounded one at a time, on the host and the device alike.
//
// nvcc contracts a product feeding a sum (w - lr * g, b * s + g) into one fused multiply-add
// by default: one rounding where the host rounds twice, so a device update would differ from
// the host loop in the last bit wherever the product is inexact. Element-wise functors that
// promise the host's bits on the device (the optimizers) write their arithmetic through
// these: on the device __fmul_rn, __fadd_rn and __fsub_rn, which the compiler never fuses; on
// the host the plain operators (an x86-64 build without -mfma has no fused instruction; a host
// build with -mfma and -ffp-contract=fast may fuse them).
#include <weft/core/config.hpp>

namespace weft::detail {

WEFT_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

WEFT_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

WEFT_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

} // namespace weft::detail
