#pragma once
// Annotations shared by host and device code.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif
