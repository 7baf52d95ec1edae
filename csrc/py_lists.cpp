#include "py_lists.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>
#include <vector>

namespace fused_amp {

namespace {

namespace py = pybind11;

constexpr const char* kCapsuleName = "fused_amp.TensorRefs";

// An object that holds `refs` until it is released.
py::object capsule_of(std::vector<at::Tensor>&& refs) {
  return py::capsule(new std::vector<at::Tensor>(std::move(refs)), kCapsuleName, [](PyObject* capsule) {
    delete static_cast<std::vector<at::Tensor>*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  });
}

// An attribute name, interned once: looking an attribute up by a C string makes and hashes a new
// string at every call, and misses the type attribute cache.
// (Kept for the life of the process, as the statics that hold them.)
py::handle name(const char* text) { return PyUnicode_InternFromString(text); }

}  // namespace

// (THPVariable_Check asks isinstance, which for a subclass such as DTensor makes and calls a
// bound __instancecheck__ each time: 0.1 us.)
bool is_tensor(PyObject* o) { return PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(THPVariableClass)); }

bool no_torch_function(PyTypeObject* type) {
  if (THPVariable_CheckTypeExact(type)) return true;
  static const py::handle disabled =
      py::object(py::module_::import("torch._C").attr("_disabled_torch_function_impl")).release();
  const py::handle cls(reinterpret_cast<PyObject*>(type));
  static const py::handle torch_function = name("__torch_function__");
  return py::hasattr(cls, torch_function) && py::object(cls.attr(torch_function)).is(disabled);
}

PyObject* hold_refs(PyObject*, PyObject* tensors) {
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> refs;
  size_t i = 0;
  for (const py::handle t : py::reinterpret_borrow<py::iterable>(tensors)) {
    if (!t.is_none() && !is_tensor(t.ptr())) {
      throw torch::TypeError("hold_refs: tensors[" + std::to_string(i) + "] is " + Py_TYPE(t.ptr())->tp_name +
                             ", not a Tensor or None");
    }
    if (!t.is_none()) refs.push_back(THPVariable_Unpack(t.ptr()));
    ++i;
  }
  return capsule_of(std::move(refs)).release().ptr();
  END_HANDLE_TH_ERRORS
}

PyObject* local_grads(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *params, *dtensor_type;
  if (!PyArg_ParseTuple(args, "OO:local_grads", &params, &dtensor_type)) throw py::error_already_set();
  if (!PyList_Check(params)) throw torch::TypeError("local_grads: params must be a list");
  if (dtensor_type != Py_None && !PyType_Check(dtensor_type)) {
    throw torch::TypeError("local_grads: dtensor_type must be a type or None");
  }
  static const py::handle grad_name = name("grad"), spec_name = name("_spec"), local_name = name("_local_tensor");
  auto* dtensor = dtensor_type == Py_None ? nullptr : reinterpret_cast<PyTypeObject*>(dtensor_type);
  const bool modes = at::impl::torch_function_mode_enabled();
  PyTypeObject* plain_type = nullptr;  // the last param type whose getters read the C++ tensor
  // (a type with no __torch_function__ of its own: Python's getters read the C++ tensor)
  const Py_ssize_t n = PyList_GET_SIZE(params);
  py::list grads(n);
  py::list specs;
  py::list spec_of(n);  // each grad's index in specs (None: not a DTensor, or no grad)
  std::vector<at::Tensor> refs;  // of the DTensor grads' local shards
  size_t sharded = 0;
  std::optional<at::Device> device;
  bool one_device = true;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* p = PyList_GET_ITEM(params, i);
    if (!is_tensor(p)) {
      throw torch::TypeError("local_grads: params[" + std::to_string(i) + "] is " + Py_TYPE(p)->tp_name +
                             ", not a Tensor");
    }
    if (!modes && Py_TYPE(p) != plain_type && no_torch_function(Py_TYPE(p))) plain_type = Py_TYPE(p);
    py::object grad = !modes && Py_TYPE(p) == plain_type
                          ? py::reinterpret_steal<py::object>(THPVariable_Wrap(THPVariable_Unpack(p).grad()))
                          : py::handle(p).attr(grad_name);
    py::object which = py::none();
    if (dtensor != nullptr && PyObject_TypeCheck(grad.ptr(), dtensor)) {
      const py::object spec = grad.attr(spec_name);
      Py_ssize_t k = 0;  // (FSDP2's grads share a few specs: a short list)
      while (k < PyList_GET_SIZE(specs.ptr()) && !py::handle(PyList_GET_ITEM(specs.ptr(), k)).is(spec)) ++k;
      if (k == PyList_GET_SIZE(specs.ptr())) specs.append(spec);
      which = py::int_(k);
      grad = grad.attr(local_name);
      ++sharded;
      // the local shard's one C++ reference is its Python object's: hold another while the
      // caller runs ops on it (see hold_refs)
      if (is_tensor(grad.ptr())) refs.push_back(THPVariable_Unpack(grad.ptr()));
    }
    if (one_device && grad.ptr() != Py_None) {
      if (is_tensor(grad.ptr())) {
        const at::Tensor& g = THPVariable_Unpack(grad.ptr());
        one_device = g.layout() == at::kStrided && (!device || *device == g.device());
        device = g.device();
      } else {
        one_device = false;
      }
    }
    PyList_SET_ITEM(grads.ptr(), i, grad.release().ptr());
    PyList_SET_ITEM(spec_of.ptr(), i, which.release().ptr());
  }
  const py::object dev = one_device && device ? py::reinterpret_steal<py::object>(THPDevice_New(*device))
                                              : py::none();
  return py::make_tuple(grads, specs, sharded, dev, refs.empty() ? py::none() : capsule_of(std::move(refs)),
                        spec_of)
      .release()
      .ptr();
  END_HANDLE_TH_ERRORS
}

PyObject* lists_unchanged(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *params, *state, *dtensor_type, *held_params, *held_locals, *held_dicts, *keys, *held_entries;
  if (!PyArg_ParseTuple(args, "OOO(OOOOO):lists_unchanged", &params, &state, &dtensor_type, &held_params,
                        &held_locals, &held_dicts, &keys, &held_entries)) {
    throw py::error_already_set();
  }
  const Py_ssize_t n = PyList_Check(held_params) ? PyList_GET_SIZE(held_params) : -1;
  const auto is_list = [n](PyObject* o) { return PyList_Check(o) && PyList_GET_SIZE(o) == n; };
  bool well_formed = n >= 0 && PyList_Check(params) && PyDict_Check(state) &&
                     (dtensor_type == Py_None || PyType_Check(dtensor_type)) &&
                     (held_locals == Py_None || is_list(held_locals)) && is_list(held_dicts) &&
                     PyTuple_Check(keys) && PyList_Check(held_entries) &&
                     PyList_GET_SIZE(held_entries) == PyTuple_GET_SIZE(keys);
  for (Py_ssize_t k = 0; well_formed && k < PyList_GET_SIZE(held_entries); ++k) {
    well_formed = is_list(PyList_GET_ITEM(held_entries, k));
  }
  if (!well_formed) {
    throw torch::TypeError(
        "lists_unchanged: params must be a list, state a dict, dtensor_type a type or None, and held (params, "
        "locals or None, state dicts, keys, entries per key) lists as long as the held params, and a tuple");
  }
  if (PyList_GET_SIZE(params) != n) Py_RETURN_FALSE;
  static const py::handle local_name = name("_local_tensor");
  auto* dtensor = dtensor_type == Py_None ? nullptr : reinterpret_cast<PyTypeObject*>(dtensor_type);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* p = PyList_GET_ITEM(params, i);
    if (p != PyList_GET_ITEM(held_params, i)) Py_RETURN_FALSE;
    if (held_locals != Py_None) {  // a DTensor's local shard, any other param itself
      const py::handle param(p);
      const py::object local = dtensor != nullptr && PyObject_TypeCheck(p, dtensor)
                                   ? param.attr(local_name)
                                   : py::reinterpret_borrow<py::object>(param);
      if (local.ptr() != PyList_GET_ITEM(held_locals, i)) Py_RETURN_FALSE;
    }
    PyObject* dict = PyDict_GetItemWithError(state, p);  // (borrowed; calls the param's __hash__)
    if (dict == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (dict == nullptr || dict != PyList_GET_ITEM(held_dicts, i) || !PyDict_Check(dict)) Py_RETURN_FALSE;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); ++k) {
      PyObject* entry = PyDict_GetItemWithError(dict, PyTuple_GET_ITEM(keys, k));
      if (entry == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if ((entry == nullptr ? Py_None : entry) != PyList_GET_ITEM(PyList_GET_ITEM(held_entries, k), i)) {
        Py_RETURN_FALSE;
      }
    }
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

}  // namespace fused_amp
