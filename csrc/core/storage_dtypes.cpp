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

// The entry of `table`, whose dtypes are `dtypes`, that has `dtype` and, where given, holds
// `bits` per element; null where none has.
template <size_t N>
const StorageKind* entry_with(const StorageKind (&table)[N], const std::array<at::ScalarType, N>& dtypes,
                              at::ScalarType dtype, int bits = 0) {
  for (size_t i = 0; i < N; ++i) {
    if (dtypes[i] == dtype && (bits == 0 || table[i].bits == bits)) return &table[i];
  }
  return nullptr;
}

}  // namespace

MasterKind master_kind_of(at::ScalarType dtype) {
  const StorageKind* entry = entry_with(kMasterKinds, master_dtypes(), dtype);
  return entry ? static_cast<MasterKind>(entry->kind) : MasterKind::None;
}

bool state_kind_of(const at::Tensor& state, const at::Tensor& param, StateKind* kind) {
  // 4-bit codes: a 1-D tensor of half the param's elements (shaped so, it is nothing else but a
  // one-element param's 8-bit codes)
  const bool halved = state.sizes() != param.sizes() && state.dim() == 1 && state.numel() == (param.numel() + 1) / 2;
  const StorageKind* entry = entry_with(kStateKinds, state_dtypes(), state.scalar_type(), halved ? 4 : 0);
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
