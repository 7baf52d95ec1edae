#pragma once
// What the kernels need from CUDA. With FUSED_AMP_HOST_SIM the same kernel and launcher source
// compiles with a host compiler and runs on the emulator of tests/cuda_sim/emulator/ (the tests'
// build only, tests/cuda_sim/): every CUDA thread of a block is an execution context of its own,
// __syncthreads a real barrier, a warp shuffle a real exchange among 32 lanes, __shared__ storage
// per block, and the emulator checks shared-memory races, barrier and warp divergence,
// uninitialised shared reads, shared bounds and misaligned vector accesses on the way. The kernels
// have one body: they spell CUDA's names (or the FA_* ones below), never the emulator's.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifdef FUSED_AMP_HOST_SIM
#include "emulator/shared.h"  // tests/cuda_sim/emulator/: the tests build with -Itests/cuda_sim
inline bool fused_amp_sim_large_args = false;  // which argument limit the emulated launches use
inline int fused_amp_sim_launches = 0;         // launches so far, for the tests
#define FA_GLOBAL
#define FA_DEVICE inline
#define FA_GRID_CONSTANT
#define FA_EMU_SITE (::fused_amp::emu::Site{__FILE__, __LINE__})
#define FA_LAUNCH(kernel, grid, block, stream, ...)                                    \
  do {                                                                               \
    ++fused_amp_sim_launches;                                                        \
    ::fused_amp::emu::launch((grid), (block), [&] { kernel(__VA_ARGS__); });         \
  } while (0)
// FA_SHARED(name, T[n]...): the block's __shared__ array `name`
#define FA_SHARED(name, ...) const auto name = ::fused_amp::emu::shared<__VA_ARGS__>(#name, FA_EMU_SITE)
#define __syncthreads() ::fused_amp::emu::syncthreads(FA_EMU_SITE)
#define FA_EMU_SHUFFLE(op, mask, var, ...) \
  ::fused_amp::emu::exchange(FA_EMU_SITE, ::fused_amp::emu::WarpOp::op, (mask), (var), __VA_ARGS__)
#define __shfl_sync(mask, var, ...) FA_EMU_SHUFFLE(ShflIdx, mask, var, __VA_ARGS__)
#define __shfl_up_sync(mask, var, ...) FA_EMU_SHUFFLE(ShflUp, mask, var, __VA_ARGS__)
#define __shfl_down_sync(mask, var, ...) FA_EMU_SHUFFLE(ShflDown, mask, var, __VA_ARGS__)
#define __shfl_xor_sync(mask, var, ...) FA_EMU_SHUFFLE(ShflXor, mask, var, __VA_ARGS__)
#define __ballot_sync(mask, pred) ::fused_amp::emu::vote(FA_EMU_SITE, ::fused_amp::emu::WarpOp::Ballot, (mask), (pred))
#define __any_sync(mask, pred) (::fused_amp::emu::vote(FA_EMU_SITE, ::fused_amp::emu::WarpOp::Any, (mask), (pred)) != 0)
#define __all_sync(mask, pred) (::fused_amp::emu::vote(FA_EMU_SITE, ::fused_amp::emu::WarpOp::All, (mask), (pred)) != 0)
// CUDA's atomicMax on 32-bit unsigned values (the emulated blocks may run on several host threads)
inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
  unsigned int seen = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > seen && !__atomic_compare_exchange_n(p, &seen, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return seen;
}
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
#define FA_SHARED(name, ...) __shared__ ::fused_amp::cuda::shared_t<__VA_ARGS__> name
#endif

namespace fused_amp::cuda {

// The type of a __shared__ declaration (FA_SHARED), an array type spelled as one argument.
template <class T>
using shared_t = T;

// p as a pointer to a vector of elements (a Pack, multi_tensor_apply.cuh), which CUDA loads and
// stores only at its alignment. x86 would serve a misaligned one silently: the emulator refuses it.
template <class V, class T>
FA_DEVICE V* vector_at(T* p) {
#ifdef FUSED_AMP_HOST_SIM
  if (reinterpret_cast<uintptr_t>(p) % alignof(V) != 0) {
    ::fused_amp::emu::fail("misaligned: a vector access of " + std::to_string(sizeof(V)) + " bytes at an address " +
                           std::to_string(reinterpret_cast<uintptr_t>(p) % alignof(V)) + " bytes past a multiple of " +
                           std::to_string(alignof(V)));
  }
#endif
  return reinterpret_cast<V*>(p);
}

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
