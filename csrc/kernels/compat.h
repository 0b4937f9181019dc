// The one place where CUDA and HIP differ for the index kernels, so that every
// .cuh in csrc/kernels is a single source for nvcc and hipcc. The kernels use no
// warp-size constant (AMD CDNA runs 64-wide wavefronts), no lane masks and no
// inline assembly: block sizes are multiples of 64, and cooperation between
// threads goes through shared memory and __syncthreads, or through
// shfl_up_in_32 below, whose groups of 32 threads are a warp on NVIDIA and
// half a wavefront on AMD.
//
// Included by plain C++ translation units too (the CPU implementations share
// the per-token formulas), where the function qualifiers expand to nothing.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>

#include <atomic>
#define UKV_GPU_COMPILER 1
#elif defined(__CUDACC__)
#include <cuda_runtime.h>

#include <atomic>
#define UKV_GPU_COMPILER 1
#endif

// A kernel of kThreads threads that must fit `blocks` blocks a multiprocessor
// (nvcc caps its registers to fit). hipcc reads a second argument as
// something else (waves per execution unit), so there it is left out.
#if defined(__HIPCC__)
#define UKV_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads)
#elif defined(__CUDACC__)
#define UKV_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
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
inline const char* error_string(Error e) { return hipGetErrorString(e); }
#elif defined(__CUDACC__)
using Stream = cudaStream_t;
using Error = cudaError_t;
constexpr Error kSuccess = cudaSuccess;
inline const char* error_string(Error e) { return cudaGetErrorString(e); }
#endif

// Programmatic dependent launch. A chain of small kernels (one forward's index
// building) is bound by launch latency, not by work: each kernel waits for the
// previous one to drain before its blocks are even scheduled. On CUDA devices
// of compute capability 9.0 and later, launch() lets the next kernel of the
// stream be scheduled while the previous one still runs; the kernel itself
// calls after_prior_kernels() before it reads anything, which waits until the
// kernels before it have finished and their writes are visible, then lets the
// kernel after it be scheduled early in turn. Kernels launched without the
// attribute (every ATen kernel) keep the plain stream order, so this changes
// no result, only when blocks start. HIP has no equivalent: there launch() is
// a plain launch and after_prior_kernels() does nothing.
#if defined(UKV_GPU_COMPILER)
UKV_DEVICE void after_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
#endif

#if defined(UKV_GPU_COMPILER)
// Thread t's v from thread t - delta of its group of 32 (threads 32g..32g+31
// of the block; t keeps its own v where t - delta lies before the group).
// Every thread of the group must call it together.
UKV_DEVICE uint64_t shfl_up_in_32(uint64_t v, int delta) {
#if defined(__HIPCC__)
  return __shfl_up(static_cast<unsigned long long>(v), static_cast<unsigned int>(delta), 32);
#else
  return __shfl_up_sync(0xffffffffu, static_cast<unsigned long long>(v), static_cast<unsigned int>(delta));
#endif
}

// The current device's multiprocessor (compute unit) count, looked up once
// per device; 0 if it cannot be read.
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};  // 0: not looked up yet
  int device = 0;
#if defined(__HIPCC__)
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= kMaxDevices) return 0;
#else
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
#endif
  int count = known[device].load(std::memory_order_relaxed);
  if (count == 0) {
#if defined(__HIPCC__)
    if (hipDeviceGetAttribute(&count, hipDeviceAttributeMultiprocessorCount, device) != hipSuccess) count = 0;
#else
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) count = 0;
#endif
    known[device].store(count, std::memory_order_relaxed);
  }
  return count;
}
#endif

#if defined(__HIPCC__)
template <typename... KernelArgs, typename... Args>
Error launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, Stream stream, const Args&... args) {
  kernel<<<grid, block, 0, stream>>>(args...);
  return hipGetLastError();
}
#elif defined(__CUDACC__)
// Whether the current device can overlap dependent launches (compute
// capability >= 9.0), looked up once per device.
inline bool current_device_overlaps_launches() {
  constexpr int kMaxDevices = 64;
  static std::atomic<signed char> known[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  signed char v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 ? 1 : -1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v > 0;
}

template <typename... KernelArgs, typename... Args>
Error launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, Stream stream, const Args&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = current_device_overlaps_launches() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
#endif

}  // namespace ukv::gpu
