# A page's program is a file of tests/docs/, line for line: the first block that opens with
# ```cpp after the heading HEADING of PAGE (or from the page's top when HEADING is empty) is
# PROGRAM. ctest builds and runs the file; this keeps the page's copy the one that compiles.
# Run: cmake -DROOT=<repository root> -DPAGE=README.md "-DHEADING=## A first program"
#            -DPROGRAM=first_program.cpp -P tests/docs/program_in_page.cmake
if(NOT DEFINED ROOT)
  get_filename_component(ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()
foreach(v PAGE PROGRAM)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "program_in_page.cmake: set -D${v}=...")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/page_section.cmake)
weft_page_section("${ROOT}" "${PAGE}" "${HEADING}" page where)
string(FIND "${page}" "```cpp\n" open)
if(open EQUAL -1)
  message(FATAL_ERROR "${where} has no ```cpp block")
endif()
math(EXPR open "${open} + 7")
string(SUBSTRING "${page}" ${open} -1 page)
string(FIND "${page}" "```" close)
string(SUBSTRING "${page}" 0 ${close} block)
file(READ "${CMAKE_CURRENT_LIST_DIR}/${PROGRAM}" program)
if(NOT block STREQUAL program)
  string(MAKE_C_IDENTIFIER "${PAGE}" stem)
  set(copy "${CMAKE_CURRENT_BINARY_DIR}/${stem}_${PROGRAM}")
  file(WRITE "${copy}" "${block}")
  message(FATAL_ERROR "${where} program differs from tests/docs/${PROGRAM}: compare ${copy} "
                      "with it")
endif()
message(STATUS "${where} program is tests/docs/${PROGRAM}")
