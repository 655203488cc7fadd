# cmake -DCOMPILER=<c++> -DINCLUDE_DIR=<weft/include> -DSOURCE=<file.cpp> -P check_compile.cmake
#
# Compiles SOURCE (syntax only) and checks the outcome its comments ask for:
#   // expected error: <text>   the compiler must fail, and <text> (a static_assert message of
#                               weft, taken literally) must be in its output; the lines after it
#                               that open with '//   ' continue <text>, joined by one space; a
#                               file may hold several, and every one must be there
#   // expected: compiles       the compiler must succeed (the harness's control)
# A file with neither line is an error of the test itself.
foreach(var COMPILER INCLUDE_DIR SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_compile.cmake: -D${var}=... missing")
  endif()
endforeach()

file(READ "${SOURCE}" text)
set(expected "")
string(REGEX MATCHALL "\n// expected error: [^\n]+(\n//   [^\n]+)*" lines "${text}")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^\n// expected error: " "" line "${line}")
  string(REPLACE "\n//   " " " line "${line}")
  list(APPEND expected "${line}")
endforeach()
if(expected STREQUAL "" AND NOT text MATCHES "\n// expected: compiles\n")
  message(FATAL_ERROR "${SOURCE}: no '// expected error: <message>' or '// expected: compiles' line")
endif()

execute_process(
  COMMAND "${COMPILER}" -std=c++20 -fsyntax-only "-I${INCLUDE_DIR}" "${SOURCE}"
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)

if(expected STREQUAL "")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} must compile, but the compiler said (exit ${rc}):\n${output}")
  endif()
  message(STATUS "${SOURCE}: compiles, as it must")
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must fail with: ${expected}")
endif()
foreach(want IN LISTS expected)
  string(FIND "${output}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR
            "${SOURCE} failed to compile (exit ${rc}), but not with '${want}':\n${output}")
  endif()
  message(STATUS "${SOURCE}: refused with '${want}'")
endforeach()
