#pragma once
// What weft::strategy reads of its parameters at compile time: a mesh's extents, whether a
// schedule splits the backward, its chunks, whether sequence parallelism is on.
#include <weft/mesh/make_comms.hpp>
#include <weft/mesh/mesh.hpp>

namespace weft::detail {

// These answer harmlessly for a type that is not what it should be, so that a bad composition
// shows the one static_assert that names it and no cascade after it.
template <class Mesh, axis A>
constexpr int static_extent() {
  if constexpr (is_mesh_v<Mesh>) {
    for (const auto& e : Mesh::spec) {
      if (e.kind == A) return e.extent;
    }
  }
  return 1;
}

template <class Mesh>
constexpr bool mesh_has_only_tp_pp_dp() {
  if constexpr (is_mesh_v<Mesh>) {
    for (const auto& e : Mesh::spec) {
      if (e.kind != axis::tp && e.kind != axis::pp && e.kind != axis::dp) return false;
    }
  }
  return true;
}

template <class Mesh>
constexpr int static_size() {
  if constexpr (is_mesh_v<Mesh>) {
    return Mesh::size;
  } else {
    return 0;
  }
}

template <class S>
constexpr bool splits_backward() {
  if constexpr (requires { S::split_backward; }) {
    return static_cast<bool>(S::split_backward);
  } else {
    return false;
  }
}

template <class P>
constexpr bool sequence_parallel_enabled() {
  if constexpr (requires { P::enabled; }) {
    return static_cast<bool>(P::enabled);
  } else {
    return false;
  }
}

template <class S>
constexpr int schedule_chunks() {
  if constexpr (requires { S::chunks; }) {
    return S::chunks;
  } else {
    return 1;
  }
}

} // namespace weft::detail
