#include "py_step.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>
#include <vector>

#include "py_lists.h"

namespace fused_amp {

namespace {

namespace py = pybind11;

// The C++ type of the step_ schema (register.cpp), as its entries take it (ops_impl.h).
using StepFn = void(c10::string_view, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                    at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                    c10::ArrayRef<int64_t>, c10::ArrayRef<double>, const c10::List<std::optional<at::Tensor>>&,
                    c10::ArrayRef<int64_t>, bool);

const c10::TypedOperatorHandle<StepFn>& step_op(bool check_only) {
  static const auto step = c10::Dispatcher::singleton().findSchemaOrThrow("fused_amp::step_", "").typed<StepFn>();
  static const auto check =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused_amp_check::step_", "").typed<StepFn>();
  return check_only ? check : step;
}

// The names of the parts after `optimizer`, for the errors (ops.py checks them first).
constexpr const char* kParts[] = {"params",  "grads",           "master_params", "states",
                                  "steps",   "state_absmaxes",  "scalar_states", "outputs",
                                  "epilogues", "epilogue_layout", "hyper",         "scalars",
                                  "rounding"};

PyObject* list_arg(PyObject* o, int part) {
  if (!PyList_Check(o)) throw torch::TypeError(std::string("call_step: ") + kParts[part] + " must be a list");
  return o;
}

// A list's tensors (None as an undefined tensor where `optional`); false where one needs
// torch.ops' handling (a __torch_function__ of its own). `checked` remembers the last type
// that needs none.
bool tensors_of(PyObject* list, int part, bool optional, std::vector<at::Tensor>& out, PyTypeObject*& checked) {
  const Py_ssize_t n = PyList_GET_SIZE(list_arg(list, part));
  out.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = PyList_GET_ITEM(list, i);
    if (optional && t == Py_None) {
      out.emplace_back();
      continue;
    }
    if (!is_tensor(t)) {
      throw torch::TypeError(std::string("call_step: ") + kParts[part] + "[" + std::to_string(i) + "] is " +
                             Py_TYPE(t)->tp_name + ", not a Tensor");
    }
    if (Py_TYPE(t) != checked) {
      if (!no_torch_function(Py_TYPE(t))) return false;
      checked = Py_TYPE(t);
    }
    out.push_back(THPVariable_Unpack(t));
  }
  return true;
}

template <class T>
std::vector<T> numbers_of(PyObject* list, int part) {
  const Py_ssize_t n = PyList_GET_SIZE(list_arg(list, part));
  std::vector<T> out(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    if constexpr (std::is_same_v<T, double>) {
      out[i] = PyFloat_AsDouble(item);
    } else {
      out[i] = PyLong_AsLongLong(item);
    }
    if (PyErr_Occurred()) throw py::error_already_set();
  }
  return out;
}

}  // namespace

PyObject* call_step(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  int check_only = 0, unscale_grads = 1;
  const char* optimizer = nullptr;
  PyObject* lists[13];
  if (!PyArg_ParseTuple(args, "psOOOOOOOOOOOOOp:call_step", &check_only, &optimizer, &lists[0],
                        &lists[1], &lists[2], &lists[3], &lists[4], &lists[5], &lists[6], &lists[7], &lists[8],
                        &lists[9], &lists[10], &lists[11], &lists[12], &unscale_grads)) {
    throw py::error_already_set();
  }
  if (at::impl::torch_function_mode_enabled()) Py_RETURN_NOTIMPLEMENTED;
  std::vector<at::Tensor> tensors[9];  // params ... epilogues (kParts 0-8); released with the GIL held
  PyTypeObject* checked = nullptr;
  for (int part = 0; part < 9; ++part) {
    if (!tensors_of(lists[part], part, false, tensors[part], checked)) Py_RETURN_NOTIMPLEMENTED;
  }
  std::vector<at::Tensor> scalar_tensors;
  if (!tensors_of(lists[11], 11, true, scalar_tensors, checked)) Py_RETURN_NOTIMPLEMENTED;
  c10::List<std::optional<at::Tensor>> scalars;
  scalars.reserve(scalar_tensors.size());
  for (at::Tensor& t : scalar_tensors) scalars.push_back(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
  const std::vector<int64_t> layout = numbers_of<int64_t>(lists[9], 9), rounding = numbers_of<int64_t>(lists[12], 12);
  const std::vector<double> hyper = numbers_of<double>(lists[10], 10);
  {
    py::gil_scoped_release no_gil;
    step_op(check_only).call(c10::string_view(optimizer), tensors[0], tensors[1], tensors[2],
                             tensors[3], tensors[4], tensors[5], tensors[6], tensors[7], tensors[8], layout, hyper,
                             scalars, rounding, unscale_grads != 0);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

}  // namespace fused_amp
