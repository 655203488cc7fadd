# cmake -DEXIT_CODE=<n> [-DFORBID=<regex>] [-DREQUIRE=<regex>] -P expect_abort.cmake -- <command...>
# Runs the command; passes when it exits with EXIT_CODE, its output does not match FORBID and
# does match REQUIRE.
# For a job ended by MPI_Abort, whose launcher's own message (help text relayed from the
# aborting process) is not reliably printed, the exit code is the errorcode given to MPI_Abort.
set(command "")
set(seen_separator FALSE)
foreach(i RANGE ${CMAKE_ARGC})
  if(seen_separator AND DEFINED CMAKE_ARGV${i})
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${EXIT_CODE}")
  message(FATAL_ERROR "expected exit code ${EXIT_CODE}, got ${rc}")
endif()
if(DEFINED FORBID AND "${out}${err}" MATCHES "${FORBID}")
  message(FATAL_ERROR "the output matches '${FORBID}'")
endif()
if(DEFINED REQUIRE AND NOT "${out}${err}" MATCHES "${REQUIRE}")
  message(FATAL_ERROR "the output does not match '${REQUIRE}'")
endif()
