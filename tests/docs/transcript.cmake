# cmake -DEXIT=<status> "-DTRANSCRIPTS=<page>:<heading>|<page>:<heading>..." [-DTRACE=<file>]
#       [-DTRACE_CATEGORIES=<category>,<category>...] -P tests/docs/transcript.cmake -- <command...>
# Pages' transcripts are what the command prints today. Runs the command once (expect_run.cmake's
# checks; with TRACE, a Chrome trace the command writes, with an event of each category), then,
# for each page, finds the first bare ``` block after the heading (an empty heading: from the
# page's top) and demands each of its lines, in order, among the output's lines. Blank lines and
# "..." (rows left out of an excerpt) are skipped. A line that reports a time or a rate (ms,
# tokens/s, a share in %) matches with any numbers and any spacing in their place; the rest of
# it, and every other line, character for character.
cmake_minimum_required(VERSION 3.21)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/expect_run.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/page_section.cmake)
get_filename_component(root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
weft_expect_run(${TRACE})
if(DEFINED TRACE)
  string(REPLACE "," ";" categories "${TRACE_CATEGORIES}")
  weft_expect_trace("${TRACE}" ${categories})
endif()

# A text's lines as a list: ';' and brackets, which would split or join list elements, become
# "@SC@", "@LB@" and "@RB@" in both the page and the output.
function(weft_transcript_lines text out)
  string(REPLACE ";" "@SC@" text "${text}")
  string(REPLACE "[" "@LB@" text "${text}")
  string(REPLACE "]" "@RB@" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

weft_transcript_lines("${out}${err}" ran)
list(LENGTH ran ran_count)

function(weft_check_transcript PAGE HEADING)
  weft_page_section("${root}" "${PAGE}" "${HEADING}" page where)
  # The first block that opens with a bare ``` (not ```cpp, ```sh, ...).
  weft_transcript_lines("${page}" page_lines)
  set(shown "")
  set(state outside) # outside, other (inside another block), transcript, done
  foreach(line IN LISTS page_lines)
    if(state STREQUAL "done")
      break()
    elseif(line MATCHES "^```")
      if(state STREQUAL "outside")
        if(line STREQUAL "```")
          set(state transcript)
        else()
          set(state other)
        endif()
      elseif(state STREQUAL "transcript")
        set(state done)
      else()
        set(state outside)
      endif()
    elseif(state STREQUAL "transcript")
      list(APPEND shown "${line}")
    endif()
  endforeach()
  if(NOT state STREQUAL "done")
    message(FATAL_ERROR "${where} has no whole ``` block")
  endif()

  set(next 0)
  set(matched 0)
  foreach(line IN LISTS shown)
    string(REGEX REPLACE " +$" "" line "${line}")
    if(line STREQUAL "" OR line MATCHES "^ *\\.\\.\\.$")
      continue()
    endif()
    # The line as a regex: special characters escaped; in a line of times or rates, each number
    # any number and each run of spaces any run.
    string(REGEX REPLACE "([][()*+?.^$|\\\\{}])" "\\\\\\1" pattern "${line}")
    if(line MATCHES "[0-9] ms|tokens/s|[0-9]%")
      string(REGEX REPLACE "[0-9]+(\\\\\\.[0-9]+)?" "[0-9]+(\\\\.[0-9]+)?" pattern "${pattern}")
      string(REGEX REPLACE " +" " +" pattern "${pattern}")
    endif()
    set(found FALSE)
    while(next LESS ran_count)
      list(GET ran ${next} candidate)
      math(EXPR next "${next} + 1")
      string(REGEX REPLACE " +$" "" candidate "${candidate}")
      if(candidate MATCHES "^${pattern}$")
        set(found TRUE)
        break()
      endif()
    endwhile()
    if(NOT found)
      string(REPLACE "@SC@" ";" line "${line}")
      string(REPLACE "@LB@" "[" line "${line}")
      string(REPLACE "@RB@" "]" line "${line}")
      message(FATAL_ERROR "${where} transcript shows a line the command no longer prints (or "
                          "prints out of order):\n  ${line}\nRun the command and copy its output "
                          "into the page.")
    endif()
    math(EXPR matched "${matched} + 1")
  endforeach()
  message(STATUS "${where} transcript: ${matched} lines, each printed by the command")
endfunction()

if(NOT DEFINED TRANSCRIPTS)
  message(FATAL_ERROR "transcript.cmake: set -DTRANSCRIPTS=<page>:<heading>|...")
endif()
string(REPLACE "|" ";" transcripts "${TRANSCRIPTS}")
foreach(t IN LISTS transcripts)
  string(FIND "${t}" ":" colon)
  string(SUBSTRING "${t}" 0 ${colon} page)
  math(EXPR colon "${colon} + 1")
  string(SUBSTRING "${t}" ${colon} -1 heading)
  weft_check_transcript("${page}" "${heading}")
endforeach()
