# cmake -DEXIT=<status> -DPROGRAM=<weft_train_3d> [-DMATCH=<regex>] [-DTRACE=<file>] -P same_losses.cmake --
#       <mpirun and its flags> <PROGRAM> <arguments> --transport mpi
# The demo on MPI processes against the demo on threads. Runs the command (expect.cmake's checks:
# its exit status, MATCH in its output, with TRACE a Chrome trace with every axis), then the same
# program and arguments without the launcher and with --transport local, and demands that both
# print the same loss table to the digits printed: per step, the 3D loss and the 1-rank loss.
cmake_minimum_required(VERSION 3.21)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/expect_run.cmake)
weft_expect_run(${TRACE})
if(DEFINED TRACE)
  weft_expect_trace("${TRACE}" compute tp pp dp)
endif()
set(mpi_out "${out}")

list(FIND cmd "${PROGRAM}" at)
if(at LESS 0)
  message(FATAL_ERROR "the command does not run PROGRAM (${PROGRAM})")
endif()
list(SUBLIST cmd ${at} -1 threads)
string(REPLACE ";--transport;mpi" ";--transport;local" threads "${threads}")
if(NOT threads MATCHES ";--transport;local")
  message(FATAL_ERROR "the command has no --transport mpi")
endif()
execute_process(COMMAND ${threads} RESULT_VARIABLE status OUTPUT_VARIABLE threads_out ERROR_VARIABLE threads_err)
message("${threads_out}${threads_err}")
if(NOT "${status}" STREQUAL "${EXIT}")
  message(FATAL_ERROR "on threads: expected exit status ${EXIT}, got ${status}")
endif()

# The table's rows: "  step   loss, 8 ranks (3D)   loss, 1 rank   relative difference". The
# difference is left out: it comes from the unrounded losses, which may differ past the digits.
function(loss_rows text out_var)
  string(REGEX MATCHALL "\n +[0-9]+ +[^ \n]+ +[^ \n]+ +[^ \n]+" rows "${text}")
  set(kept "")
  foreach(row IN LISTS rows)
    string(REGEX REPLACE "^\n +([0-9]+) +([^ ]+) +([^ ]+) .*" "step \\1: \\2 (3D), \\3 (1 rank)" row "${row}")
    list(APPEND kept "${row}")
  endforeach()
  set(${out_var} "${kept}" PARENT_SCOPE)
endfunction()
loss_rows("${mpi_out}" on_mpi)
loss_rows("${threads_out}" on_threads)
if(NOT on_mpi)
  message(FATAL_ERROR "no loss table in the MPI run's output")
endif()
if(NOT on_mpi STREQUAL on_threads)
  string(REPLACE ";" "\n  " a "${on_mpi}")
  string(REPLACE ";" "\n  " b "${on_threads}")
  message(FATAL_ERROR "the losses differ:\n MPI processes:\n  ${a}\n threads:\n  ${b}")
endif()
list(LENGTH on_mpi n)
message("the same losses on MPI processes and on threads, ${n} steps")
