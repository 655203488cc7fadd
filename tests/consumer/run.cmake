# One consumer test, run by ctest as `cmake -P` with the variables CMakeLists.txt here
# passes: starts from an empty WORK_DIR, (for find_package) installs weft into a prefix
# inside it, then configures, builds and runs the consumer project.
cmake_minimum_required(VERSION 3.21)

function(run_step step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc COMMAND_ECHO STDOUT)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_${CONSUMER}: ${step} failed: ${rc}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(build_dir ${WORK_DIR}/build)
set(configure_options -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_BUILD_TYPE=${CONFIG}")
if(MAKE_PROGRAM)
  list(APPEND configure_options -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
set(config_option)
if(CONFIG)
  set(config_option --config ${CONFIG})
endif()

if(CONSUMER STREQUAL "subdirectory")
  list(APPEND configure_options -DWEFT_SOURCE_DIR=${WEFT_SOURCE_DIR})
elseif(CONSUMER STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  run_step(install ${CMAKE_COMMAND} --install ${WEFT_BINARY_DIR} --prefix ${prefix} ${config_option})
  list(APPEND configure_options -DCMAKE_PREFIX_PATH=${prefix} -DWEFT_EXPECTED_PREFIX=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
else()
  message(FATAL_ERROR "CONSUMER must be subdirectory or find_package, not '${CONSUMER}'")
endif()

run_step(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build_dir} ${configure_options})
run_step(build ${CMAKE_COMMAND} --build ${build_dir} ${config_option})

# Single-config generators put the executable in the build folder, multi-config ones in a
# folder per configuration.
foreach(candidate ${build_dir}/weft_consumer ${build_dir}/${CONFIG}/weft_consumer)
  if(EXISTS ${candidate} AND NOT IS_DIRECTORY ${candidate})
    run_step(run ${candidate})
    return()
  endif()
endforeach()
message(FATAL_ERROR "consumer_${CONSUMER}: no weft_consumer executable under ${build_dir}")
