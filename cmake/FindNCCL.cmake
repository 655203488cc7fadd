# FindNCCL: NCCL's header and library, as the imported target NCCL::NCCL.
#
# Looks beside the CUDA toolkit first (CUDA 13 images ship nccl.h in its include/ and
# libnccl in its lib/), then in the system paths, then in the NVIDIA NCCL wheel of the Python
# on PATH (nvidia/nccl/{include,lib}, whose library is only libnccl.so.2); NCCL_ROOT or the
# NCCL_HOME environment variable point elsewhere. Sets NCCL_FOUND, NCCL_INCLUDE_DIR,
# NCCL_LIBRARY, NCCL_VERSION.
set(_weft_nccl_hints ${NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _weft_nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _weft_nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_weft_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${_weft_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_program(_weft_nccl_python NAMES python3 python)
  if(_weft_nccl_python)
    execute_process(
      COMMAND ${_weft_nccl_python} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _weft_nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_weft_nccl_wheel)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_weft_nccl_wheel}/include NO_DEFAULT_PATH)
      find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_weft_nccl_wheel}/lib NO_DEFAULT_PATH)
    endif()
  endif()
  mark_as_advanced(_weft_nccl_python)
endif()
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _weft_nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" _maj "${_weft_nccl_v}")
  string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" _min "${_weft_nccl_v}")
  string(REGEX REPLACE ".*NCCL_PATCH ([0-9]+).*" "\\1" _pat "${_weft_nccl_v}")
  set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
