# cmake -DEXIT=<status> -DMATCH=<regex> [-DNO_MATCH=<regex>] [-DJSON=<file>] [-DITERS_ABOVE=<n>]
#       -P expect.cmake -- <command...>
# NO_MATCH: a regex the output must not match (a doubled prefix, tables that should not have run).
# ITERS_ABOVE: with JSON, every row made more than n timed calls (--min_time_ms raised -n), and
# the rows of one size as many.
cmake_minimum_required(VERSION 3.21)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/expect_run.cmake)
weft_expect_run(${JSON})
if(DEFINED JSON)
  # The rows must be there and carry the fields a plot script reads.
  file(READ "${JSON}" json)
  string(JSON rows LENGTH "${json}" rows)
  if(rows LESS 1)
    message(FATAL_ERROR "${JSON} has no rows")
  endif()
  foreach(field op dtype redop algorithm chosen transport ranks topology bytes count time_us algbw_GBps
                busbw_GBps model_us wrong iters)
    string(JSON value ERROR_VARIABLE missing GET "${json}" rows 0 ${field})
    if(missing)
      message(FATAL_ERROR "${JSON}: row 0 lacks '${field}': ${missing}")
    endif()
  endforeach()
  if(DEFINED ITERS_ABOVE)
    math(EXPR last "${rows} - 1")
    foreach(i RANGE ${last})
      string(JSON iters GET "${json}" rows ${i} iters)
      string(JSON bytes GET "${json}" rows ${i} bytes)
      if(NOT iters GREATER ITERS_ABOVE)
        message(FATAL_ERROR "${JSON}: row ${i} made ${iters} timed calls, not more than ${ITERS_ABOVE}")
      endif()
      if(DEFINED iters_at_${bytes} AND NOT iters_at_${bytes} EQUAL iters)
        message(FATAL_ERROR "${JSON}: rows of ${bytes} B made ${iters_at_${bytes}} and ${iters} timed calls")
      endif()
      set(iters_at_${bytes} ${iters})
    endforeach()
  endif()
  string(JSON wrong GET "${json}" rows 0 wrong)
  message("${JSON}: ${rows} rows, row 0 wrong = ${wrong}")
endif()
