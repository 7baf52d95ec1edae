#pragma once
// Passes over the Python lists of an optimizer step that cost a microsecond per param or more
// in Python, in C: fused_amp._C.hold_refs, fused_amp._C.local_grads and lists_unchanged.
#include <Python.h>

namespace fused_amp {

// Whether `o` is a tensor (of torch.Tensor's type or a subtype): what THPVariable_Unpack needs.
bool is_tensor(PyObject* o);

// Whether tensors of this type have no __torch_function__ of their own: a Tensor or Parameter,
// or a subclass whose __torch_function__ is torch._C._disabled_torch_function_impl (DTensor).
// Python's getters of such a tensor read the C++ tensor, and torch's bindings call no Python
// for it (unless a torch-function mode is active).
bool no_torch_function(PyTypeObject* type);

// hold_refs(tensors) -> an opaque object holding one C++ reference to each tensor of the
// sequence (None items are skipped; anything else raises TypeError), released with it.
//
// Why: since torch 2.10 a tensor whose only C++ reference is its Python object's moves its
// Python refcount whenever a second C++ reference comes or goes, and the op dispatcher drops
// its references to the arguments of an op called from Python (torch.ops) with the GIL
// released, so each such tensor argument made the thread take the GIL once more inside the
// op. The optimizers keep these references beside their cached lists, so that the count never
// falls back to one while the lists are in use.
PyObject* hold_refs(PyObject* self, PyObject* tensors);

// local_grads(params, dtensor_type) -> (grads, specs, sharded, device, refs, spec_of): for each param its
// ``.grad``, as the fused ops take it: the grad itself, or the local shard (``_local_tensor``) of
// a grad of type ``dtensor_type`` (None: there is no DTensor); None where a param has no grad.
// ``specs``: the distinct ``_spec`` objects of those DTensor grads (by identity, in order of first
// appearance), from which the caller takes meshes and placements; ``sharded``: how many grads
// were DTensors; ``device``: the device of every grad when all are dense and on one device, else
// None; ``refs``: a hold_refs object of the DTensor grads' local shards (None without any), whose
// one C++ reference is their Python object's: the caller keeps it while it runs ops on them;
// ``spec_of``: for each param the index of its grad's spec in ``specs`` (None: no DTensor grad).
//
// ``.grad`` is read from the C++ tensor where Python's getter would do the same (no
// __torch_function__ of the param's type, no torch-function mode active), else through Python.
PyObject* local_grads(PyObject* self, PyObject* args);

// lists_unchanged(params, state, dtensor_type, held) -> bool: whether what the optimizer's cached
// lists of a group were built from is still there. ``held`` is (params, locals, state_dicts, keys,
// entries) as they were then: the same param objects in the same order; where ``locals`` is not
// None, the same local shards (``_local_tensor``) of the params of type ``dtensor_type`` (any
// other param is its own); ``state.get(p)`` the same dict for each param; and in it, for each key
// of ``keys``, the same entry as ``entries[k][i]`` (None where there was none). One pass, which
// touches the params, the state's table and each param's state dict, not the tensors.
PyObject* lists_unchanged(PyObject* self, PyObject* args);

}  // namespace fused_amp
