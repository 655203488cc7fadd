# weft_page_section(<root> <page> <heading> <text var> <where var>): the text of <page> from the
# line <heading> on (the whole page when <heading> is empty), and how to name that place in a
# message ("README.md's \"## Quick start\""). A page without the heading is a fatal error.
function(weft_page_section root page heading text_var where_var)
  file(READ "${root}/${page}" text)
  set(where "${page}")
  if(NOT "${heading}" STREQUAL "")
    string(FIND "${text}" "${heading}\n" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${page} has no \"${heading}\" heading")
    endif()
    string(SUBSTRING "${text}" ${at} -1 text)
    set(where "${page}'s \"${heading}\"")
  endif()
  set(${text_var} "${text}" PARENT_SCOPE)
  set(${where_var} "${where}" PARENT_SCOPE)
endfunction()
