# cmake -DEXIT=<status> [-DMATCH=<regex>] [-DNO_MATCH=<regex>] [-DSTDOUT_JSON=ON] -P expect.cmake -- <command...>
# The suites' checks: the exit status, a regex the output must match and one it must not, and
# with STDOUT_JSON that stdout alone is Google Benchmark JSON with rows (--benchmark_format=json
# piped to a file is what plot.py reads; a status line printed there would break it).
cmake_minimum_required(VERSION 3.21)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/expect_run.cmake)
weft_expect_run()
if(STDOUT_JSON)
  string(JSON rows ERROR_VARIABLE bad LENGTH "${out}" benchmarks)
  if(bad)
    message(FATAL_ERROR "stdout is not Google Benchmark JSON: ${bad}")
  endif()
  if(rows LESS 1)
    message(FATAL_ERROR "stdout's JSON has no benchmarks")
  endif()
endif()
