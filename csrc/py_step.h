#pragma once
// The step op called from Python without torch.ops' boxing: fused_amp._C.call_step.
#include <Python.h>

namespace fused_amp {

// call_step(check_only, optimizer, params, grads, master_params, states, steps, state_absmaxes,
// scalar_states, outputs, epilogues, epilogue_layout, hyper, scalars, rounding, unscale_grads):
// torch.ops.fused_amp.step_ (fused_amp_check.step_ with check_only) on its parts in the schema's
// order, called through the dispatcher unboxed (dispatch keys, modes and the profiler's record
// as from torch.ops), with the GIL released. Returns None; or NotImplemented, having done
// nothing, where a tensor of the lists has a __torch_function__ of its own or a torch-function
// mode is active: what only torch.ops' Python binding handles, so the caller calls that instead.
//
// Why: torch.ops converts a call from Python into a boxed stack, looking each of the schema's
// 15 arguments up by name and each list item by type: ~8 us per call on the CPU, twice what
// torch's whole _fused_adamw_ costs on a 4k-element tensor, and torchao's offload engine
// steps one param at a time.
PyObject* call_step(PyObject* self, PyObject* args);

}  // namespace fused_amp
