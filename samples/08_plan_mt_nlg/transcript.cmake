# cmake -DPLAN=<weft-plan> -P transcript.cmake
# Runs run.sh with PLAN and demands its exit status 0 and that README.md's console blocks are its
# output, line for line: the transcripts in the README are what weft-plan prints today.
cmake_minimum_required(VERSION 3.21)
set(here ${CMAKE_CURRENT_LIST_DIR})
execute_process(COMMAND sh ${here}/run.sh ${PLAN} OUTPUT_VARIABLE ran ERROR_VARIABLE err RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "run.sh exited ${status}:\n${ran}${err}")
endif()

# The lines of the README's ```console blocks, and of the run, without blank ones.
file(STRINGS ${here}/README.md readme)
set(shown "")
set(inside FALSE)
foreach(line IN LISTS readme)
  if(line STREQUAL "```console")
    set(inside TRUE)
  elseif(line STREQUAL "```")
    set(inside FALSE)
  elseif(inside AND NOT line STREQUAL "")
    string(APPEND shown "${line}\n")
  endif()
endforeach()
string(REGEX REPLACE "\n\n+" "\n" ran "${ran}")
string(REGEX REPLACE "^\n" "" ran "${ran}")
if(NOT shown STREQUAL ran)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/transcript_expected.txt "${shown}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/transcript_ran.txt "${ran}")
  message(FATAL_ERROR "samples/08_plan_mt_nlg/README.md's console blocks differ from what run.sh prints now: "
                      "diff ${CMAKE_CURRENT_BINARY_DIR}/transcript_expected.txt "
                      "${CMAKE_CURRENT_BINARY_DIR}/transcript_ran.txt, and copy the run into the README")
endif()
message(STATUS "README.md's transcripts match run.sh")
