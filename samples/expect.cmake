# cmake -DEXIT=<status> [-DMATCH=<regex>] [-DTRACE=<file>] -P expect.cmake -- <command...>
# A sample's test: runs it and demands its exit status, a match of MATCH in its output (stdout
# and stderr), and with TRACE a Chrome trace there (weft_train_3d --trace) with every axis in it.
cmake_minimum_required(VERSION 3.21)
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/expect_run.cmake)
weft_expect_run(${TRACE})
if(DEFINED TRACE)
  weft_expect_trace("${TRACE}" compute tp pp dp)
endif()
