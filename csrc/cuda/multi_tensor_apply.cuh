#pragma once
// One kernel launch over many tensors: their addresses and sizes, and for each block its tensor
// and chunk, travel as the kernel argument (as in PyTorch and Apex). Lists with up to kLists
// pointers per tensor (param, grad, master, states, step...) are walked in lockstep.
#include <cstdint>
#include <vector>

#include "cuda/compat.cuh"
#include "cuda/launch.h"

namespace fused_amp::cuda {

// Blocks have their real sizes in every build; the emulator's test build (tests/cuda_sim/) cuts
// smaller chunks and launch metadata (FUSED_AMP_SIM_*) so that every boundary of the launch plan
// is cheap to reach.
constexpr int kBlockSize = 512;
constexpr int kILP = 4;
#ifndef FUSED_AMP_SIM_CHUNK_SIZE
constexpr int64_t kChunkSize = 65536;
#else
constexpr int64_t kChunkSize = FUSED_AMP_SIM_CHUNK_SIZE;
#endif

// How a launch cuts its tensors: elements per chunk (one block of threads each) and threads per
// block. Elementwise kernels use any; the kernels of 8-bit state (cuda/step_states.cuh) need
// chunks and tiles of whole quant blocks.
struct ElementwiseShape {
  static constexpr int64_t kChunk = kChunkSize;
  static constexpr int kThreads = kBlockSize;
};
struct TileShape {
  static constexpr int kThreads = 512;
#ifndef FUSED_AMP_SIM_TILE_CHUNK
  static constexpr int64_t kChunk = 65536;
#else  // e.g. 10 quant blocks of 256: a whole tile of 2048 elements and 512 of the next
  static constexpr int64_t kChunk = FUSED_AMP_SIM_TILE_CHUNK;
#endif
};
constexpr int kFunctorBytes = 256;  // room left in the argument for the functor

// Kernel arguments are limited to 4 KB, or 32 KB with CUDA >= 12.1 on the runtime and driver.
template <int kLists, int kArgBytes>
struct TensorListMeta {
#ifndef FUSED_AMP_SIM_CHUNK_SIZE
  static constexpr int kMaxBlocks = kArgBytes <= 4096 ? 320 : 2240;
  static constexpr int kMaxTensors =
      (kArgBytes - kFunctorBytes - kMaxBlocks * 6) / (8 * (kLists + 1));
#else
  static constexpr int kMaxBlocks = kArgBytes <= 4096 ? FUSED_AMP_SIM_MAX_BLOCKS : 2 * FUSED_AMP_SIM_MAX_BLOCKS;
  static constexpr int kMaxTensors = kArgBytes <= 4096 ? FUSED_AMP_SIM_MAX_TENSORS : 2 * FUSED_AMP_SIM_MAX_TENSORS;
#endif
  static_assert(kMaxTensors < 65536, "block_to_tensor is 16-bit");
  void* ptr[kLists][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t block_to_chunk[kMaxBlocks];
  uint16_t block_to_tensor[kMaxBlocks];
};

template <class Shape, class Meta, class Functor>
FA_GLOBAL void multi_tensor_kernel(const FA_GRID_CONSTANT Meta meta, const Functor f) {
  const int t = meta.block_to_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * Shape::kChunk;
  const int64_t left = meta.numel[t] - start;
  f(meta, t, start, left < Shape::kChunk ? left : Shape::kChunk);
}

// ---- reductions: each thread of a block computes a partial value (F::partial), the block
// combines them in a fixed tree (v[i] = combine(v[i], v[i + s]) for s = blockDim/2, ..., 1) and
// thread 0 hands the result on (F::finish). The order never changes between runs.
template <class F>
FA_GLOBAL void block_reduce_kernel(const FA_GRID_CONSTANT F f) {
  FA_SHARED(v, typename F::acc_t[kBlockSize]);
  v[threadIdx.x] = f.partial();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (threadIdx.x < s) v[threadIdx.x] = f.combine(v[threadIdx.x], v[threadIdx.x + s]);
  }
  if (threadIdx.x == 0) f.finish(v[0]);
}

template <class F>
void launch_block_reduce(int blocks, const F& f, cudaStream_t stream) {
  FA_LAUNCH((block_reduce_kernel<F>), blocks, kBlockSize, stream, f);
}

// A multi-tensor reduction: Functor::partial(meta, t, start, n) per thread of a chunk's block,
// Functor::finish(meta, t, chunk, value) once per chunk.
template <class Meta, class Functor>
struct ChunkReduce {
  using acc_t = typename Functor::acc_t;
  Meta meta;
  Functor f;

  FA_DEVICE acc_t partial() const {
    const int t = meta.block_to_tensor[blockIdx.x];
    const int64_t start = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunkSize;
    const int64_t left = meta.numel[t] - start;
    return f.partial(meta, t, start, left < kChunkSize ? left : kChunkSize);
  }
  FA_DEVICE acc_t combine(acc_t a, acc_t b) const { return f.combine(a, b); }
  FA_DEVICE void finish(acc_t v) const {
    f.finish(meta, meta.block_to_tensor[blockIdx.x], meta.block_to_chunk[blockIdx.x], v);
  }
};

// True when the 32 KB argument limit can be used (decided once per process).
bool large_kernel_args();

template <bool kReduce, class Shape, class Meta, class Functor>
void launch_meta(const Meta& meta, int blocks, const Functor& f, cudaStream_t stream) {
  if constexpr (kReduce) {
    launch_block_reduce(blocks, ChunkReduce<Meta, Functor>{meta, f}, stream);
  } else {
    FA_LAUNCH((multi_tensor_kernel<Shape, Meta, Functor>), blocks, Shape::kThreads, stream, meta, f);
  }
}

template <int kLists, int kArgBytes, bool kReduce, class Shape, class Functor>
void launch_lists(const std::vector<TensorPtrs>& tensors, const Functor& f, cudaStream_t stream) {
  using Meta = TensorListMeta<kLists, kArgBytes>;
  static_assert(sizeof(Meta) + sizeof(Functor) <= kArgBytes, "kernel argument too large");
  Meta meta;
  int slot = 0;
  int blocks = 0;
  for (const TensorPtrs& t : tensors) {
    if (t.numel == 0) continue;  // no block may index an empty tensor
    for (int k = 0; k < kLists; ++k) meta.ptr[k][slot] = t.p[k];
    meta.numel[slot] = t.numel;
    const int64_t chunks = (t.numel + Shape::kChunk - 1) / Shape::kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[blocks] = static_cast<uint16_t>(slot);
      meta.block_to_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == Meta::kMaxBlocks || (last_chunk && slot + 1 == Meta::kMaxTensors)) {
        launch_meta<kReduce, Shape>(meta, blocks, f, stream);
        blocks = 0;
        if (last_chunk) {
          slot = -1;  // the next tensor starts the next launch at slot 0
        } else {      // this tensor's remaining chunks continue in slot 0
          for (int k = 0; k < kLists; ++k) meta.ptr[k][0] = meta.ptr[k][slot];
          meta.numel[0] = meta.numel[slot];
          slot = 0;
        }
      }
    }
    ++slot;
  }
  if (blocks > 0) launch_meta<kReduce, Shape>(meta, blocks, f, stream);
}

// Runs f on every chunk of every tensor; with kReduce, f is a multi-tensor reduction (above).
template <int kLists, bool kReduce = false, class Shape = ElementwiseShape, class Functor>
void multi_tensor_apply(const std::vector<TensorPtrs>& tensors, const Functor& f, cudaStream_t stream) {
  if (large_kernel_args()) {
    launch_lists<kLists, 32768, kReduce, Shape>(tensors, f, stream);
  } else {
    launch_lists<kLists, 4096, kReduce, Shape>(tensors, f, stream);
  }
}

// ---- per-thread access to a chunk: kILP elements per thread and iteration ----

template <typename T>
struct alignas(sizeof(T) * kILP) Pack {
  T v[kILP];
};

// Which kILP elements a thread handles: contiguous (one vector load) or strided by the block.
struct IlpIndex {
  int64_t base;
  int64_t stride;
  int64_t n;
  bool packed;
};

// A list's pointer for tensor t, from element `start` (null stays null: an absent tensor).
template <typename T>
FA_DEVICE T* list_at(const void* const p, int64_t start) {
  return p ? static_cast<T*>(const_cast<void*>(p)) + start : nullptr;
}

template <typename T>
FA_DEVICE bool is_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T>) == 0;
}

template <typename R, typename T>
FA_DEVICE void load_ilp(R (&r)[kILP], const T* p, const IlpIndex& x) {
  if (x.packed) {
    const Pack<T> pk = *vector_at<const Pack<T>>(p + x.base);
#pragma unroll
    for (int j = 0; j < kILP; ++j) r[j] = widen(pk.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      const int64_t i = x.base + j * x.stride;
      r[j] = i < x.n ? static_cast<R>(widen(p[i])) : R(0);
    }
  }
}

template <typename T, typename R>
FA_DEVICE void store_ilp(T* p, const R (&r)[kILP], const IlpIndex& x) {
  if (x.packed) {
    Pack<T> pk;
#pragma unroll
    for (int j = 0; j < kILP; ++j) pk.v[j] = from_float<T>(r[j]);
    *vector_at<Pack<T>>(p + x.base) = pk;
  } else {
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      const int64_t i = x.base + j * x.stride;
      if (i < x.n) p[i] = from_float<T>(r[j]);
    }
  }
}

// Calls f(IlpIndex) until this thread has covered its share of the chunk's n elements.
template <class F>
FA_DEVICE void for_each_ilp(int64_t n, bool aligned, F&& f) {
  if (aligned && n % kILP == 0) {
    for (int64_t b = static_cast<int64_t>(threadIdx.x) * kILP; b < n; b += blockDim.x * kILP) {
      f(IlpIndex{b, 1, n, true});
    }
  } else {
    for (int64_t b = threadIdx.x; b < n; b += static_cast<int64_t>(blockDim.x) * kILP) {
      f(IlpIndex{b, blockDim.x, n, false});
    }
  }
}

}  // namespace fused_amp::cuda
