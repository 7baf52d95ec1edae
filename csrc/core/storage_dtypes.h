#pragma once
// The storage kinds of storage_kinds.h as tensors hold them: each kind by the dtype of its tensor,
// and codes by their size (8-bit: one byte per element, shaped as the param; 4-bit: two per byte,
// a 1-D tensor of the param's numel / 2 bytes, rounded up).
#include <ATen/core/Tensor.h>

#include <string>

#include "storage_kinds.h"

namespace fused_amp::core {

// The kind of a master tensor of `dtype`; None where no kind has that dtype.
MasterKind master_kind_of(at::ScalarType dtype);
// The kind of a state tensor of `param`; false where no kind holds a tensor of its dtype. A uint8
// state shaped as neither kind's codes is 8-bit codes here; validation names its shape.
bool state_kind_of(const at::Tensor& state, const at::Tensor& param, StateKind* kind);
// The state kinds' dtypes as c10 names them, for messages: "Float, BFloat16 or Byte".
std::string state_dtype_names();

}  // namespace fused_amp::core
