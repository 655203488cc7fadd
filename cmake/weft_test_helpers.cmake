# CMake functions for weft's own tests, benchmarks, samples and tools (never installed).
include_guard(GLOBAL)

# weft_checked_test(<name> CHECKER <checker.cmake> EXIT <status> [DEFINE <VAR>=<value>...]
#                   [TIMEOUT <seconds>] [LABELS <label>...] [ENVIRONMENT <VAR>=<value>...]
#                   COMMAND <command> [args...])
# A ctest, <name>, that runs `cmake -DEXIT=<status> -D<VAR>=<value>... -P <checker> -- <command...>`:
# the checker, a script that includes cmake/expect_run.cmake, runs the command and demands its
# exit status and what the other definitions ask for (ctest's own properties check the status
# or the text, not both). A DEFINE with an empty value is left out, so that a caller passes its
# optional arguments as they are ("MATCH=${arg_MATCH}") and the checker sees them undefined.
# TIMEOUT is 120 s unless given.
function(weft_checked_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "CHECKER;EXIT;TIMEOUT" "DEFINE;LABELS;ENVIRONMENT;COMMAND")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "weft_checked_test(${name}): unexpected arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  foreach(required CHECKER EXIT COMMAND)
    if(NOT DEFINED arg_${required})
      message(FATAL_ERROR "weft_checked_test(${name}): ${required} is required")
    endif()
  endforeach()
  set(defs -DEXIT=${arg_EXIT})
  foreach(def IN LISTS arg_DEFINE)
    if(NOT def MATCHES "^[A-Za-z_][A-Za-z0-9_]*=")
      message(FATAL_ERROR "weft_checked_test(${name}): DEFINE takes <VAR>=<value>, not '${def}'")
    endif()
    if(NOT def MATCHES "^[A-Za-z_][A-Za-z0-9_]*=$")
      list(APPEND defs "-D${def}")
    endif()
  endforeach()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} ${defs} -P ${arg_CHECKER} -- ${arg_COMMAND})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${arg_TIMEOUT})
  if(arg_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${arg_LABELS}")
  endif()
  if(arg_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${arg_ENVIRONMENT}")
  endif()
endfunction()

# weft_add_file_executable(<name variable> <source> [BLAS <regex>] [LIBRARIES <library>...]):
# an executable of one source file under the current source folder, named after its path there
# without .cpp (comm/ring_test.cpp: comm_ring_test), linking weft::weft, weft_dev_flags and
# LIBRARIES, with that folder on its include path; the name goes to <name variable>. A file whose
# path there matches BLAS links weft::blas too, and is skipped (<name variable> empty) where there
# is no BLAS (WEFT_ENABLE_BLAS). tests/ and benchmarks/ build one such executable per file.
function(weft_add_file_executable name_var src)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "BLAS" "LIBRARIES")
  file(RELATIVE_PATH rel ${CMAKE_CURRENT_SOURCE_DIR} ${src})
  set(${name_var} "" PARENT_SCOPE)
  set(blas FALSE)
  if(DEFINED arg_BLAS AND rel MATCHES "${arg_BLAS}")
    if(NOT TARGET weft_blas)
      return()
    endif()
    set(blas TRUE)
  endif()
  string(REGEX REPLACE "\\.cpp$" "" name ${rel})
  string(REPLACE "/" "_" name ${name})
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE weft::weft weft_dev_flags ${arg_LIBRARIES})
  if(blas)
    target_link_libraries(${name} PRIVATE weft::blas)
  endif()
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  set(${name_var} ${name} PARENT_SCOPE)
endfunction()

# weft_precompiled_test_headers(<target>): where WEFT_PRECOMPILE_HEADERS is ON, <target>, a
# GoogleTest executable of tests/, reuses the precompiled tests/support/precompiled.hpp. GCC and
# clang take a precompiled header only with the flags it was built with, and the tests' flags
# differ in one respect, WEFT_COMPILE_BOUND (-O0), so there is one header per value of it, each
# built by an object library of its own (weft_test_pch, weft_test_pch_compile_bound) with the
# tests' flags. Call it once the target's WEFT_COMPILE_BOUND is final.
function(weft_precompiled_test_headers target)
  if(NOT WEFT_PRECOMPILE_HEADERS)
    return()
  endif()
  get_property(bound TARGET ${target} PROPERTY WEFT_COMPILE_BOUND)
  set(owner weft_test_pch)
  if(bound)
    set(owner weft_test_pch_compile_bound)
  endif()
  if(NOT TARGET ${owner})
    add_library(${owner} OBJECT ${PROJECT_SOURCE_DIR}/tests/support/precompiled.cpp)
    target_link_libraries(${owner} PRIVATE weft::weft weft_dev_flags GTest::gtest)
    target_include_directories(${owner} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    set_target_properties(${owner} PROPERTIES WEFT_COMPILE_BOUND "${bound}")
    target_precompile_headers(${owner} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/precompiled.hpp)
  endif()
  target_precompile_headers(${target} REUSE_FROM ${owner})
endfunction()
