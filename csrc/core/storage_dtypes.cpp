#include "core/storage_dtypes.h"

#include <c10/util/Exception.h>

#include <array>

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

// The entry of `table`, whose dtypes are `dtypes`, that has `dtype`; null where none has.
template <size_t N>
const StorageKind* entry_with(const StorageKind (&table)[N], const std::array<at::ScalarType, N>& dtypes,
                              at::ScalarType dtype) {
  for (size_t i = 0; i < N; ++i) {
    if (dtypes[i] == dtype) return &table[i];
  }
  return nullptr;
}

}  // namespace

MasterKind master_kind_of(at::ScalarType dtype) {
  const StorageKind* entry = entry_with(kMasterKinds, master_dtypes(), dtype);
  return entry ? static_cast<MasterKind>(entry->kind) : MasterKind::None;
}

bool state_kind_of(at::ScalarType dtype, StateKind* kind) {
  const StorageKind* entry = entry_with(kStateKinds, state_dtypes(), dtype);
  if (entry) *kind = static_cast<StateKind>(entry->kind);
  return entry != nullptr;
}

std::string state_dtype_names() {
  std::string names;
  for (size_t i = 0; i < state_dtypes().size(); ++i) {
    names += (i == 0 ? "" : (i + 1 == state_dtypes().size() ? " or " : ", "));
    names += c10::toString(state_dtypes()[i]);
  }
  return names;
}

}  // namespace fused_amp::core
