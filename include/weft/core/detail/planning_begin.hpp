// No include guard, by design: opens a region of set-up and planning code (topologies,
// meshes, plan generators, the cost model). It runs once per communicator, plan or
// algorithm choice, whose results are cached, never once per call; GCC compiles it at -O1, which
// takes about half a second off every translation unit that includes <weft/weft.hpp>
// (scripts/compile-time). planning_end.hpp closes the region. Define WEFT_NO_PLANNING_PRAGMAS to
// compile it like everything else. nvcc (which warns on the pragma) compiles it like everything
// else too.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__OPTIMIZE__) &&   \
    !defined(WEFT_NO_PLANNING_PRAGMAS)
#pragma GCC push_options
#pragma GCC optimize("O1")
#endif
