// The one place where CUDA and HIP differ for the index kernels, so that every
// .cuh in csrc/kernels is a single source for nvcc and hipcc. The kernels use no
// warp-size constant (AMD CDNA runs 64-wide wavefronts), no lane masks and no
// inline assembly: block sizes are multiples of 64, and cooperation between
// threads goes through shared memory and __syncthreads only.
//
// Included by plain C++ translation units too (the CPU implementations share
// the per-token formulas), where the function qualifiers expand to nothing.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define UKV_GPU_COMPILER 1
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define UKV_GPU_COMPILER 1
#endif

#if defined(UKV_GPU_COMPILER)
#define UKV_HOST_DEVICE __host__ __device__ __forceinline__
#define UKV_DEVICE __device__ __forceinline__
#else
#define UKV_HOST_DEVICE inline
#endif

namespace ukv::gpu {

#if defined(__HIPCC__)
using Stream = hipStream_t;
using Error = hipError_t;
constexpr Error kSuccess = hipSuccess;
inline Error last_launch_error() { return hipGetLastError(); }
inline const char* error_string(Error e) { return hipGetErrorString(e); }
#elif defined(__CUDACC__)
using Stream = cudaStream_t;
using Error = cudaError_t;
constexpr Error kSuccess = cudaSuccess;
inline Error last_launch_error() { return cudaGetLastError(); }
inline const char* error_string(Error e) { return cudaGetErrorString(e); }
#endif

}  // namespace ukv::gpu
