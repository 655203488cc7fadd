// No include guard, by design: closes the region that planning_begin.hpp opened.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__OPTIMIZE__) &&   \
    !defined(WEFT_NO_PLANNING_PRAGMAS)
#pragma GCC pop_options
#endif
