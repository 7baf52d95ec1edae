#pragma once
// What the kernels need from CUDA. With FUSED_AMP_HOST_SIM the same kernel and launcher source
// compiles with a host compiler and a launch runs as loops over blocks and threads: exact for
// kernels whose threads never meet (no shared memory, no __syncthreads, no warp shuffles). The
// two kinds whose threads do meet have a simulated form of that step: the block reductions
// (multi_tensor_apply.cuh) and the tiles of 8-bit state (step_states.cuh), launched with
// FA_LAUNCH_WHOLE_BLOCKS, which runs the kernel once per block and leaves the threads to it. The
// tests use it to check the launcher's chunking on machines without a GPU (tests/test_cuda_sim.py).
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifdef FUSED_AMP_HOST_SIM
#include <algorithm>
struct FaDim3 { unsigned x = 0, y = 0, z = 0; };
inline FaDim3 threadIdx, blockIdx, blockDim, gridDim;
inline bool fused_amp_sim_large_args = false;  // which argument limit the simulated launches use
inline int fused_amp_sim_launches = 0;         // launches so far, for the tests
#define FA_GLOBAL
#define FA_DEVICE inline
#define FA_GRID_CONSTANT
#define FA_LAUNCH(kernel, grid, block, stream, ...)                          \
  do {                                                                     \
    ++fused_amp_sim_launches;                                              \
    gridDim.x = (grid);                                                    \
    blockDim.x = (block);                                                  \
    for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)             \
      for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)       \
        kernel(__VA_ARGS__);                                               \
  } while (0)
#define FA_LAUNCH_WHOLE_BLOCKS(kernel, grid, block, stream, ...)             \
  do {                                                                     \
    ++fused_amp_sim_launches;                                              \
    gridDim.x = (grid);                                                    \
    blockDim.x = (block);                                                  \
    threadIdx.x = 0;                                                       \
    for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)             \
      kernel(__VA_ARGS__);                                                 \
  } while (0)
#else
#include <cuda_runtime_api.h>
#define FA_GLOBAL __global__
#define FA_DEVICE __device__ __forceinline__
#define FA_GRID_CONSTANT __grid_constant__
#define FA_LAUNCH(kernel, grid, block, stream, ...)                                        \
  do {                                                                                   \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);                               \
    const cudaError_t fa_err = cudaGetLastError();                                       \
    if (fa_err != cudaSuccess) {                                                         \
      throw std::runtime_error(std::string("fused_amp: CUDA launch failed: ") +          \
                               cudaGetErrorString(fa_err));                              \
    }                                                                                    \
  } while (0)
#define FA_LAUNCH_WHOLE_BLOCKS FA_LAUNCH
#endif

namespace fused_amp::cuda {

// The value a kernel computes with: fp32 for half types; other types (fp32, fp64, and the
// integers the inf/NaN check reads the bits as) as they are.
FA_DEVICE float widen(float x) { return x; }
FA_DEVICE double widen(double x) { return x; }
FA_DEVICE float widen(__half x) { return __half2float(x); }
FA_DEVICE float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
FA_DEVICE uint8_t widen(uint8_t x) { return x; }
FA_DEVICE int16_t widen(int16_t x) { return x; }
FA_DEVICE uint16_t widen(uint16_t x) { return x; }
FA_DEVICE int32_t widen(int32_t x) { return x; }
FA_DEVICE int64_t widen(int64_t x) { return x; }

// Round to nearest even, as torch's .to(dtype) does.
template <typename T> FA_DEVICE T from_float(float x);
template <> FA_DEVICE float from_float<float>(float x) { return x; }
template <> FA_DEVICE __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> FA_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> FA_DEVICE T from_float(double x) { return static_cast<T>(x); }
// raw bit patterns (a bf16 param's bits, its remainder, a 24-bit master's byte) are stored as they are
template <typename T> FA_DEVICE T from_float(uint16_t x) { return static_cast<T>(x); }
template <typename T> FA_DEVICE T from_float(uint8_t x) { return static_cast<T>(x); }

}  // namespace fused_amp::cuda
