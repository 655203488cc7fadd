# cmake -DCOMPILER=<c++> -DINCLUDE_DIR=<weft/include> -DSOURCE=<file.cpp> -P check_compile.cmake
#
# Compiles SOURCE (syntax only) and checks the outcome its comments ask for:
#   // expected error: <text>   the compiler must fail, and <text> (a static_assert message of
#                               weft::strategy, taken literally) must be in its output
#   // expected: compiles       the compiler must succeed (the harness's control)
# A file with neither line is an error of the test itself.
foreach(var COMPILER INCLUDE_DIR SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_compile.cmake: -D${var}=... missing")
  endif()
endforeach()

file(READ "${SOURCE}" text)
set(expected "")
if(text MATCHES "\n// expected error: ([^\n]+)")
  set(expected "${CMAKE_MATCH_1}")
elseif(NOT text MATCHES "\n// expected: compiles\n")
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
string(FIND "${output}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${SOURCE} failed to compile (exit ${rc}), but not with '${expected}':\n${output}")
endif()
message(STATUS "${SOURCE}: refused with '${expected}'")
