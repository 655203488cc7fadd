#pragma once
// Annotations shared by host and device code.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

// Rarely run code: building an error message, or what runs once per new plan or algorithm
// choice (plan generators, the cost model), not per call. Kept out of line and optimised for
// size, which keeps a translation unit that includes weft cheap to compile (plans are cached,
// so their speed hardly matters).
#if defined(__GNUC__) || defined(__clang__)
#define WEFT_COLD [[gnu::cold, gnu::noinline]]
#else
#define WEFT_COLD
#endif

// Deprecated, for one release: use WEFT_COLD.
#define WEFT_PLANNING WEFT_COLD
