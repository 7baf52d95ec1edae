#pragma once
// The storage kinds of storage_kinds.h as tensors hold them: each kind by the dtype of its tensor.
#include <c10/core/ScalarType.h>

#include <string>

#include "storage_kinds.h"

namespace fused_amp::core {

// The kind of a master tensor of `dtype`; None where no kind has that dtype.
MasterKind master_kind_of(at::ScalarType dtype);
// The kind of state tensors of `dtype`; false where no kind has that dtype.
bool state_kind_of(at::ScalarType dtype, StateKind* kind);
// The state kinds' dtypes as c10 names them, for messages: "Float, BFloat16 or Byte".
std::string state_dtype_names();

}  // namespace fused_amp::core
