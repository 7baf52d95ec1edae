// Small kernels for the emulator's own tests (tests/test_cuda_emulator.py), written as device code
// is (CUDA's names through cuda/compat.cuh): what each warp exchange hands each lane, the order
// of the schedules, and one kernel per mistake each check must report. Every entry point returns
// 0, or 1 after an error whose text fa_sim_error() gives (entry.h).
#include <string>

#include "cuda/multi_tensor_apply.cuh"
#include "entry.h"

using namespace fused_amp::cuda;

namespace {

enum Exchange { kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll };

// Each lane in `mask` calls the exchange with its value 100 + thread and `arg` (for the votes, the
// predicate: value % arg == 0); out[thread] = what it got.
FA_GLOBAL void exchange_kernel(int kind, unsigned mask, int arg, int width, int64_t* out) {
  if (!(mask >> (threadIdx.x % warpSize) & 1u)) return;
  const int v = 100 + static_cast<int>(threadIdx.x);
  int64_t r = 0;
  switch (kind) {
    case kShfl: r = __shfl_sync(mask, v, arg, width); break;
    case kShflUp: r = __shfl_up_sync(mask, v, arg, width); break;
    case kShflDown: r = __shfl_down_sync(mask, v, arg, width); break;
    case kShflXor: r = __shfl_xor_sync(mask, v, arg, width); break;
    case kBallot: r = __ballot_sync(mask, v % arg == 0); break;
    case kAny: r = __any_sync(mask, v % arg == 0); break;
    case kAll: r = __all_sync(mask, v % arg == 0); break;
  }
  out[threadIdx.x] = r;
}

// out[thread] = its place in the order the threads ran before the barrier, then after it each
// thread reads its neighbour's value from shared memory (the barrier makes it visible).
FA_GLOBAL void order_kernel(int* counter, int* order, int* neighbour) {
  FA_SHARED(s, int[kBlockSize]);
  order[blockIdx.x * blockDim.x + threadIdx.x] = (*counter)++;
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  neighbour[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Each kernel below makes the mistake its name says.
FA_GLOBAL void barrier_skipped_kernel() {
  if (threadIdx.x < 256) __syncthreads();  // the others exit
}
FA_GLOBAL void divergent_barrier_kernel() {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}
FA_GLOBAL void race_kernel(int* out) {  // each thread writes its element and reads its neighbour's
  FA_SHARED(s, int[kBlockSize]);
  s[threadIdx.x] = 1;
  __syncthreads();
  s[threadIdx.x] = 2;
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
FA_GLOBAL void write_race_kernel() {
  FA_SHARED(s, int[1]);
  s[0] = static_cast<int>(threadIdx.x);
}
FA_GLOBAL void uninitialised_kernel(int* out) {
  FA_SHARED(s, int[kBlockSize]);
  if (threadIdx.x != 5) s[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
FA_GLOBAL void out_of_bounds_kernel(int* out) {
  FA_SHARED(s, int[kBlockSize]);
  s[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x + 1];
}
FA_GLOBAL void misaligned_kernel(const float* p, float* out) {
  float r[kILP];
  load_ilp(r, p, IlpIndex{1, 1, 8, true});  // a vector load one element past an aligned address
  out[threadIdx.x] = r[0];
}
FA_GLOBAL void lane_left_out_kernel() {  // every lane calls with a mask of lanes 0-15
  __shfl_xor_sync(0x0000ffffu, 1, 1);
}
FA_GLOBAL void lane_exited_kernel() {  // lane 7 exits before the exchange its mask names it in
  if (threadIdx.x % warpSize == 7) return;
  __shfl_xor_sync(0xffffffffu, 1, 1);
}
FA_GLOBAL void full_warp_kernel() {  // launched with 40 threads: warp 1 has 8 lanes
  __shfl_xor_sync(0xffffffffu, 1, 1);
}
FA_GLOBAL void divergent_exchange_kernel() {  // the half-warps call two different shuffles
  if (threadIdx.x % warpSize < 16) {
    __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    __shfl_xor_sync(0xffffffffu, 2, 1);
  }
}
FA_GLOBAL void bad_width_kernel() { __shfl_xor_sync(0xffffffffu, 1, 1, 12); }
FA_GLOBAL void read_outside_mask_kernel() {  // lanes 0-15 read lanes 16-31
  if (threadIdx.x % warpSize < 16) __shfl_xor_sync(0x0000ffffu, 1, 16);
}
FA_GLOBAL void exchange_and_barrier_kernel() {  // warp 0's lane 0 waits at a barrier instead
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    if (threadIdx.x < warpSize) __shfl_xor_sync(0xffffffffu, 1, 1);
    __syncthreads();
  }
}

}  // namespace

extern "C" {

int fa_check_exchange(int kind, unsigned mask, int arg, int width, int threads, int64_t* out) {
  return guarded([&] { FA_LAUNCH(exchange_kernel, 1, threads, nullptr, kind, mask, arg, width, out); });
}
int fa_check_order(int blocks, int* counter, int* order, int* neighbour) {
  return guarded([&] { FA_LAUNCH(order_kernel, blocks, kBlockSize, nullptr, counter, order, neighbour); });
}

// The mistakes, by name.
int fa_check_mistake(const char* name, float* data) {
  const std::string m = name;
  int* out = reinterpret_cast<int*>(data);
  return guarded([&] {
    if (m == "barrier skipped") FA_LAUNCH(barrier_skipped_kernel, 2, kBlockSize, nullptr);
    if (m == "divergent barrier") FA_LAUNCH(divergent_barrier_kernel, 1, kBlockSize, nullptr);
    if (m == "race") FA_LAUNCH(race_kernel, 1, kBlockSize, nullptr, out);
    if (m == "write race") FA_LAUNCH(write_race_kernel, 1, kBlockSize, nullptr);
    if (m == "uninitialised") FA_LAUNCH(uninitialised_kernel, 1, kBlockSize, nullptr, out);
    if (m == "out of bounds") FA_LAUNCH(out_of_bounds_kernel, 1, kBlockSize, nullptr, out);
    if (m == "misaligned") FA_LAUNCH(misaligned_kernel, 1, 1, nullptr, data, data);
    if (m == "lane left out") FA_LAUNCH(lane_left_out_kernel, 1, warpSize, nullptr);
    if (m == "lane exited") FA_LAUNCH(lane_exited_kernel, 1, warpSize, nullptr);
    if (m == "read outside mask") FA_LAUNCH(read_outside_mask_kernel, 1, warpSize, nullptr);
    if (m == "mask past block") FA_LAUNCH(full_warp_kernel, 1, 40, nullptr);
    if (m == "divergent exchange") FA_LAUNCH(divergent_exchange_kernel, 1, warpSize, nullptr);
    if (m == "bad width") FA_LAUNCH(bad_width_kernel, 1, warpSize, nullptr);
    if (m == "exchange and barrier") FA_LAUNCH(exchange_and_barrier_kernel, 1, 64, nullptr);
  });
}

}  // extern "C"
