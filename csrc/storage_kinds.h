#pragma once
// The storage kinds: where the fp32 value of a param lives (the optimizers' master_weights) and
// how its optimizer state is held (state_dtype). Each kind is one entry of a table here, read by
// validation (core/storage_dtypes.h: the dtypes), the CPU loops (cpu/loops.h: one loop per state
// kind, a master by its kind), the CUDA launcher (cuda/step.cuh: a kernel per kind) and Python
// (fused_amp/optim/_memory.py, through _C.storage_kinds(): option values, state keys, dtypes).
// Their bits: ops/rounding.h (masters, bf16 state), ops/quantize.h (8- and 4-bit codes).
#include "ops/quantize.h"
#include "ops/quantize4.h"

namespace fused_amp {

// Output is no master: an optimizer that writes no param (ops::Elementwise::kWritesOutput) writes its
// bf16 output where the master would be; the CUDA kernels take it from the descriptor.
enum class MasterKind : int { None = 0, Fp32 = 1, Remainder = 2, Remainder8 = 3, Output = 4 };
enum class StateKind : int { Fp32 = 0, BFloat16 = 1, Codes8 = 2, Codes4 = 3 };

struct StorageKind {
  int kind;            // its MasterKind or StateKind
  const char* option;  // the option value that picks it: master_weights, or state_dtype's name
  const char* key;     // the optimizer-state key of a master's tensor (null for state)
  const char* dtype;   // the dtype of its tensors, as torch names it (torch.float32: "float32")
  int bits;            // per element (4-bit codes: two to a byte of a uint8 tensor)
  int block;           // codes: the elements that share an absmax (ops/quantize.h); 0 otherwise
  bool bf16_params;    // part of a bf16 param's bits: bf16 params only (the param is its top half)
  bool rounds;         // holds the fp32 value rounded: to nearest even, or stochastically
};

constexpr StorageKind kMasterKinds[] = {
    {static_cast<int>(MasterKind::Fp32), "fp32", "master_param", "float32", 32, 0, false, false},
    {static_cast<int>(MasterKind::Remainder), "remainder", "master_remainder", "int16", 16, 0, true, false},
    {static_cast<int>(MasterKind::Remainder8), "remainder8", "master_remainder8", "uint8", 8, 0, true, true},
};

// Codes come with their blocks' absmaxes (ops/quantize.h), in a list of their own. A code kind
// is its math's struct (ops::Quant8, ops::Quant4: bits, block, value, code), from which both
// backends build their loops. It is picked by its option, state_dtype's name: 4-bit codes are
// held in uint8 tensors (torch.uint4 takes a byte per element), told from 8-bit codes by their
// size (core/step_args.cpp).
template <class Q>
constexpr StorageKind code_kind(StateKind kind, const char* option) {
  return {static_cast<int>(kind), option, nullptr, "uint8", Q::kBits, Q::kBlock, false, true};
}
constexpr StorageKind kStateKinds[] = {
    {static_cast<int>(StateKind::Fp32), "float32", nullptr, "float32", 32, 0, false, false},
    {static_cast<int>(StateKind::BFloat16), "bfloat16", nullptr, "bfloat16", 16, 0, false, true},
    code_kind<ops::Quant8>(StateKind::Codes8, "uint8"),
    code_kind<ops::Quant4>(StateKind::Codes4, "uint4"),
};
// The code kinds' math in the table's order, after the element-wise kinds: the CPU loop table
// (cpu/loops_impl.h) and the CUDA dispatch (cuda/storage_traits.cuh) expand it.
template <class... Q>
struct CodeKinds {};
using CodeKindList = CodeKinds<ops::Quant8, ops::Quant4>;
constexpr int kFirstCodeKind = static_cast<int>(StateKind::Codes8);
constexpr int kStateKindCount = sizeof kStateKinds / sizeof kStateKinds[0];
template <class... Q>
constexpr bool lists_the_table(CodeKinds<Q...>) {
  int i = kFirstCodeKind;
  return sizeof...(Q) == kStateKindCount - kFirstCodeKind &&
         ((kStateKinds[i].bits == Q::kBits && kStateKinds[i++].block == Q::kBlock) && ...);
}
static_assert(lists_the_table(CodeKindList{}), "CodeKindList holds the table's code kinds, in its order");
// A state kind's entry (the table is in StateKind's order).
constexpr const StorageKind& state_storage(StateKind kind) { return kStateKinds[static_cast<int>(kind)]; }

// A master kind's entry; null for None and Output.
constexpr const StorageKind* master_storage(MasterKind kind) {
  for (const StorageKind& k : kMasterKinds) {
    if (k.kind == static_cast<int>(kind)) return &k;
  }
  return nullptr;
}
// The bytes per element of a master kind's tensor (an output's bf16: 2).
constexpr int master_bytes(MasterKind kind) {
  return master_storage(kind) ? master_storage(kind)->bits / 8 : (kind == MasterKind::Output ? 2 : 0);
}
// Whether a state kind holds codes in blocks, each with its absmax (8- and 4-bit state).
constexpr bool is_quantized(StateKind kind) { return state_storage(kind).block > 0; }
// The bytes of n codes of `bits` (< 8) each, packed (a last byte's unused bits are 0).
constexpr int64_t packed_code_bytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

}  // namespace fused_amp
