#pragma once
// Checking CUDA runtime and NCCL calls: a failed call throws weft::error with the call's
// text, where it was made, and the error's name and description.
#include <weft/core/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace weft::cuda::detail {

WEFT_COLD inline std::string describe_failure(const char* call, const char* file, int line,
                                              const std::string& what) {
  return "weft: " + std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
         what;
}

WEFT_COLD inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

WEFT_COLD inline std::string nccl_error_text(ncclResult_t r) {
  // NCCL has no name function; its results are few and stable.
  const char* name = "ncclUnknownResult";
  switch (r) {
    case ncclSuccess: name = "ncclSuccess"; break;
    case ncclUnhandledCudaError: name = "ncclUnhandledCudaError"; break;
    case ncclSystemError: name = "ncclSystemError"; break;
    case ncclInternalError: name = "ncclInternalError"; break;
    case ncclInvalidArgument: name = "ncclInvalidArgument"; break;
    case ncclInvalidUsage: name = "ncclInvalidUsage"; break;
    case ncclRemoteError: name = "ncclRemoteError"; break;
    case ncclInProgress: name = "ncclInProgress"; break;
    default: break;
  }
  return std::string(name) + " (" + ncclGetErrorString(r) + ")";
}

[[noreturn]] WEFT_COLD inline void throw_cuda(cudaError_t e, const char* call, const char* file,
                                              int line) {
  throw weft::error(describe_failure(call, file, line, cuda_error_text(e)));
}

[[noreturn]] WEFT_COLD inline void throw_nccl(ncclResult_t r, const char* call, const char* file,
                                              int line) {
  throw weft::error(describe_failure(call, file, line, nccl_error_text(r)));
}

} // namespace weft::cuda::detail

/// Runs a CUDA runtime call; on failure throws weft::error naming the call, file:line and the
/// error, e.g.
///   "weft: cudaMalloc(&p, n) failed at x.cu:12: cudaErrorMemoryAllocation (out of memory)".
#define WEFT_CUDA_TRY(call)                                                                        \
  do {                                                                                             \
    const cudaError_t weft_cuda_status_ = (call);                                                  \
    if (weft_cuda_status_ != cudaSuccess) {                                                        \
      ::weft::cuda::detail::throw_cuda(weft_cuda_status_, #call, __FILE__, __LINE__);              \
    }                                                                                              \
  } while (false)

/// Runs an NCCL call; on failure throws weft::error as WEFT_CUDA_TRY does.
#define WEFT_NCCL_TRY(call)                                                                        \
  do {                                                                                             \
    const ncclResult_t weft_nccl_status_ = (call);                                                 \
    if (weft_nccl_status_ != ncclSuccess) {                                                        \
      ::weft::cuda::detail::throw_nccl(weft_nccl_status_, #call, __FILE__, __LINE__);              \
    }                                                                                              \
  } while (false)
