#pragma once
// WEFT_MPI_TRY(call [, operation, rank, peer]): runs an MPI call and turns a failure into a
// weft::error that quotes the call, its file:line, MPI's error class and string, and where
// the caller knows them the operation, the rank and the peer:
//
//   weft: all_reduce on rank 3 (peer 2): MPI_Irecv(...) failed at mpi.hpp:412:
//   MPI_ERR_TRUNCATE: MPI_ERR_TRUNCATE: message truncated
//
// MPI only reports errors this way on communicators whose error handler is
// MPI_ERRORS_RETURN; weft sets it on every communicator it creates. On a communicator with
// MPI's default handler (MPI_ERRORS_ARE_FATAL) MPI aborts the job itself before returning.
#include <weft/core/error.hpp>

#include <mpi.h>

#include <string>
#include <string_view>

namespace weft::detail {

/// The name of an MPI error class, "MPI_ERR_OTHER" style, or "" for a class MPI does not
/// define by name (an implementation's own).
inline std::string_view mpi_error_class_name(int error_class) noexcept {
  struct named {
    int cls;
    std::string_view name;
  };
  // Not a switch: the MPI_ERR_* constants need not be constant expressions.
  const named table[] = {
      {MPI_SUCCESS, "MPI_SUCCESS"},         {MPI_ERR_BUFFER, "MPI_ERR_BUFFER"},
      {MPI_ERR_COUNT, "MPI_ERR_COUNT"},     {MPI_ERR_TYPE, "MPI_ERR_TYPE"},
      {MPI_ERR_TAG, "MPI_ERR_TAG"},         {MPI_ERR_COMM, "MPI_ERR_COMM"},
      {MPI_ERR_RANK, "MPI_ERR_RANK"},       {MPI_ERR_REQUEST, "MPI_ERR_REQUEST"},
      {MPI_ERR_ROOT, "MPI_ERR_ROOT"},       {MPI_ERR_GROUP, "MPI_ERR_GROUP"},
      {MPI_ERR_OP, "MPI_ERR_OP"},           {MPI_ERR_TOPOLOGY, "MPI_ERR_TOPOLOGY"},
      {MPI_ERR_DIMS, "MPI_ERR_DIMS"},       {MPI_ERR_ARG, "MPI_ERR_ARG"},
      {MPI_ERR_UNKNOWN, "MPI_ERR_UNKNOWN"}, {MPI_ERR_TRUNCATE, "MPI_ERR_TRUNCATE"},
      {MPI_ERR_OTHER, "MPI_ERR_OTHER"},     {MPI_ERR_INTERN, "MPI_ERR_INTERN"},
      {MPI_ERR_PENDING, "MPI_ERR_PENDING"}, {MPI_ERR_IN_STATUS, "MPI_ERR_IN_STATUS"},
      {MPI_ERR_NO_MEM, "MPI_ERR_NO_MEM"},   {MPI_ERR_INFO, "MPI_ERR_INFO"},
  };
  for (const named& n : table) {
    if (n.cls == error_class) return n.name;
  }
  return "";
}

/// "MPI_ERR_RANK: invalid rank" for an MPI error code (class name, then MPI's own string).
inline std::string mpi_error_text(int code) {
  int cls = MPI_ERR_UNKNOWN;
  if (MPI_Error_class(code, &cls) != MPI_SUCCESS) cls = MPI_ERR_UNKNOWN;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  std::string s(mpi_error_class_name(cls));
  if (s.empty()) s = "MPI error class " + std::to_string(cls);
  if (MPI_Error_string(code, text, &len) == MPI_SUCCESS && len > 0) {
    s += ": " + std::string(text, static_cast<std::size_t>(len));
  } else {
    s += " (code " + std::to_string(code) + ")";
  }
  return s;
}

[[noreturn]] inline void mpi_fail(int code, std::string_view call, std::string_view file, int line,
                                  std::string_view operation, int rank, int peer) {
  const auto slash = file.find_last_of('/');
  const std::string_view where = slash == std::string_view::npos ? file : file.substr(slash + 1);
  throw error(operation, rank, peer,
              std::string(call) + " failed at " + std::string(where) + ":" + std::to_string(line) +
                  ": " + mpi_error_text(code));
}

inline void mpi_check(int code, std::string_view call, std::string_view file, int line,
                      std::string_view operation = {}, int rank = error::unknown,
                      int peer = error::unknown) {
  if (code != MPI_SUCCESS) mpi_fail(code, call, file, line, operation, rank, peer);
}

} // namespace weft::detail

/// Runs an MPI call; on a result other than MPI_SUCCESS throws weft::error. The optional
/// arguments name the operation (a string), the rank and the peer (-1: unknown).
#define WEFT_MPI_TRY(call, ...)                                                                    \
  ::weft::detail::mpi_check((call), #call, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
