#pragma once
// weft's device backend on top of everything in weft.hpp; compile with nvcc (C++20) and link
// weft::cuda (the CUDA runtime, NCCL, cuBLAS).
//
//   weft/cuda/error.cuh     WEFT_CUDA_TRY, WEFT_NCCL_TRY
//   weft/cuda/types.cuh     weft::half / bfloat16 as __half / __nv_bfloat16; NCCL's type names
//   weft/cuda/memory.cuh    device_buffer, stream, event; device_count, no_device_reason
//   weft/cuda/kernels.cuh   stream-ordered reduce, copy, divide (16-byte vectorized)
//   weft/cuda/nccl.cuh      weft::cuda::nccl::communicator: weft's plans and algo::vendor on NCCL
//   weft/cuda/p2p.cuh       weft::cuda::p2p: algo::direct by loads from peers' device memory
//   weft/cuda/emulated.cuh  weft::cuda::emulated: N ranks on one GPU, to test device paths
//   weft/cuda/data_parallel.cuh  weft::optim::data_parallel (ZeRO) in device memory, on streams
//
// Not included, because they need MPI too: weft/cuda/nccl_mpi.cuh and weft/cuda/p2p_mpi.cuh.
#include <weft/cuda/async.cuh>
#include <weft/cuda/data_parallel.cuh>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/cuda/nccl.cuh>
#include <weft/cuda/p2p.cuh>
#include <weft/cuda/two_level.cuh>
#include <weft/cuda/types.cuh>
#include <weft/weft.hpp>
