#include "core/storage_dtypes.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <vector>

namespace fused_amp::core {

namespace {

// The dtype torch names `name` ("float32": torch.float32).
at::ScalarType dtype_named(const char* name) {
  for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions); ++i) {
    const auto dtype = static_cast<at::ScalarType>(i);
    if (c10::getDtypeNames(dtype).first == name) return dtype;
  }
  TORCH_INTERNAL_ASSERT(false, "storage_kinds.h names a dtype torch does not have: ", name);
}

// The dtypes of a table's entries, looked up once (a step asks per param).
template <size_t N>
std::array<at::ScalarType, N> dtypes_of(const StorageKind (&table)[N]) {
  std::array<at::ScalarType, N> dtypes;
  for (size_t i = 0; i < N; ++i) dtypes[i] = dtype_named(table[i].dtype);
  return dtypes;
}

const auto& master_dtypes() {
  static const auto dtypes = dtypes_of(kMasterKinds);
  return dtypes;
}
const auto& state_dtypes() {
  static const auto dtypes = dtypes_of(kStateKinds);
  return dtypes;
}

}  // namespace

MasterKind master_kind_of(at::ScalarType dtype) {
  for (size_t i = 0; i < master_dtypes().size(); ++i) {
    if (master_dtypes()[i] == dtype) return static_cast<MasterKind>(kMasterKinds[i].kind);
  }
  return MasterKind::None;
}

bool state_kind_of(const at::Tensor& state, const at::Tensor& param, StateKind* kind) {
  // codes of fewer than 8 bits: a 1-D tensor of packed_code_bytes (shaped so, it is nothing else
  // but a one-element param's 8-bit codes); the entries of a dtype are otherwise its first
  const StorageKind* entry = nullptr;
  for (size_t i = 0; i < state_dtypes().size(); ++i) {
    if (state_dtypes()[i] != state.scalar_type()) continue;
    const int bits = kStateKinds[i].bits;
    const bool packed_shape = state.sizes() != param.sizes() && state.dim() == 1 &&
                              state.numel() == packed_code_bytes(param.numel(), bits);
    if (bits < 8 ? packed_shape : !entry) entry = &kStateKinds[i];
  }
  if (entry) *kind = static_cast<StateKind>(entry->kind);
  return entry != nullptr;
}

std::string state_dtype_names() {
  std::string names;
  std::vector<at::ScalarType> distinct;  // (8- and 4-bit codes are both Byte)
  for (const at::ScalarType dtype : state_dtypes()) {
    if (std::find(distinct.begin(), distinct.end(), dtype) == distinct.end()) distinct.push_back(dtype);
  }
  for (size_t i = 0; i < distinct.size(); ++i) {
    names += (i == 0 ? "" : (i + 1 == distinct.size() ? " or " : ", "));
    names += c10::toString(distinct[i]);
  }
  return names;
}

}  // namespace fused_amp::core
