# README.md's first program is tests/docs/first_program.cpp, line for line: the block after
# "## A first program" that opens with ```cpp. ctest builds and runs the file
# (docs_first_program_run); this keeps the README's copy the one that compiles.
# Run: cmake -DROOT=<repository root> -P tests/docs/first_program.cmake
if(NOT DEFINED ROOT)
  get_filename_component(ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()
file(READ "${ROOT}/README.md" readme)
string(FIND "${readme}" "## A first program" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no \"## A first program\" section")
endif()
string(SUBSTRING "${readme}" ${at} -1 readme)
string(FIND "${readme}" "```cpp\n" open)
if(open EQUAL -1)
  message(FATAL_ERROR "README.md's \"A first program\" has no ```cpp block")
endif()
math(EXPR open "${open} + 7")
string(SUBSTRING "${readme}" ${open} -1 readme)
string(FIND "${readme}" "```" close)
string(SUBSTRING "${readme}" 0 ${close} block)
file(READ "${CMAKE_CURRENT_LIST_DIR}/first_program.cpp" program)
if(NOT block STREQUAL program)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/first_program_in_readme.cpp" "${block}")
  message(FATAL_ERROR "README.md's first program differs from tests/docs/first_program.cpp: "
                      "compare ${CMAKE_CURRENT_BINARY_DIR}/first_program_in_readme.cpp with it")
endif()
message(STATUS "README.md's first program is tests/docs/first_program.cpp")
