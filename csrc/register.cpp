// The op schemas, the CPU (and validation-only) implementations' registration, and the Python
// module fused_amp._C.
#include <Python.h>
#include <torch/library.h>

#include <iterator>
#include <string>

#include "cpu/loops.h"
#include "storage_kinds.h"
#include "ops_impl.h"
#include "py_lists.h"
#include "py_step.h"
#ifdef FUSED_AMP_WITH_CUDA
#include "cuda/launch.h"
#endif

namespace {

// The schemas, defined twice: the ops themselves (fused_amp::) and their validation alone
// (fused_amp_check::, the same arguments), which torch.compile's fake kernels run on meta
// tensors so that they refuse exactly what the real kernels refuse (fused_amp/_fake.py).
constexpr const char* kSchemas[] = {
    "unscale_(Tensor(a!)[] tensors, Tensor(b!) found_inf, Tensor inv_scale) -> ()",
    "non_finite_check_(Tensor[] tensors, Tensor(a!) found_inf) -> ()",
    "grad_norm_(Tensor[] tensors, Tensor(a!) found_inf, Tensor(b!) norm, Tensor? inv_scale=None, "
    "float norm_type=2.0) -> ()",
    "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor found_inf, "
    "float growth_factor, float backoff_factor, int growth_interval, *, int hysteresis=1, "
    "Tensor(c!)? hysteresis_tracker=None, float? min_scale=None, float? max_scale=None) -> ()",
    // step_'s parts, one role per list (ops_impl.h): `epilogues` holds what the step writes besides
    // the params, laid out as `epilogue_layout` says; `hyper` the optimizer's hyperparameters,
    // then lr and max_grad_norm; `scalars` the read-only scalar tensors (lr_tensor, inv_scale,
    // found_inf, grad_norm); `rounding` the stochastic rounding's seed and whether 8-bit codes
    // take it. No written list holds a None: an empty tensor stands for none.
    "step_(str optimizer, Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] master_params, "
    "Tensor(c!)[] states, Tensor(d!)[] steps, *, Tensor(h!)[] state_absmaxes, Tensor(e!)[] scalar_states, "
    "Tensor(u!)[] outputs, Tensor(f!)[] epilogues, int[] epilogue_layout, float[] hyper, Tensor?[] scalars, "
    "int[] rounding, bool unscale_grads=True) -> ()",
    "delayed_scale_update_(Tensor(a!)[] amax_histories, Tensor(b!)[] scales, Tensor(c!)[] scale_invs, *, "
    "float fp8_max, float margin=0.0, str amax_compute_algo=\"max\", Tensor? amax_reduction_buffer=None) -> ()"};

// The ops' names, in the order of kSchemas.
constexpr const char* kOps[] = {"unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_",
                                "delayed_scale_update_"};
static_assert(std::size(kOps) == std::size(kSchemas));

void define_ops(torch::Library& m) {
  for (const char* schema : kSchemas) m.def(schema);
}

}  // namespace

TORCH_LIBRARY(fused_amp, m) { define_ops(m); }
TORCH_LIBRARY(fused_amp_check, m) { define_ops(m); }

TORCH_LIBRARY_IMPL(fused_amp, CPU, m) { fused_amp::register_entries<fused_amp::cpu::Device>(m); }
TORCH_LIBRARY_IMPL(fused_amp_check, CompositeExplicitAutograd, m) {
  fused_amp::register_entries<fused_amp::meta::Device>(m);
}

namespace {

// Sparse tensors reach no kernel: name the argument that holds one instead of the dispatcher's
// "could not run with arguments from the SparseCPU backend".
void reject_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  for (size_t a = 0; a < args.size(); ++a) {
    const c10::IValue& v = (*stack)[first + a];
    if (v.isTensor() && v.toTensor().is_sparse()) {
      TORCH_CHECK_VALUE(false, op.schema().name(), ": ", args[a].name(),
                        " is sparse; only dense (strided) tensors are supported");
    }
    if (v.isTensorList()) {
      const auto list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        TORCH_CHECK_VALUE(!list.get(i).is_sparse(), op.schema().name(), ": ", args[a].name(), "[",
                          i, "] is sparse; only dense (strided) tensors are supported");
      }
    }
  }
  TORCH_CHECK_VALUE(false, op.schema().name(), ": sparse tensors are not supported");
}

void register_sparse_rejection(torch::Library& m) {
  for (const char* op : kOps) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&reject_sparse>());
  }
}

#ifdef FUSED_AMP_WITH_CUDA
constexpr bool kWithCuda = true;
constexpr const char* kCudaArchs = FUSED_AMP_CUDA_ARCHS;
#else
constexpr bool kWithCuda = false;
constexpr const char* kCudaArchs = "";
#endif

PyObject* build_info(PyObject*, PyObject*) {
  const bool bf16 = std::string(fused_amp::cpu::loops().isa) == "AVX512" && fused_amp::cpu::bf16_conversion;
  return Py_BuildValue("{s:s,s:O,s:s,s:s,s:O}", "torch_version", FUSED_AMP_TORCH_VERSION, "cuda",
                       kWithCuda ? Py_True : Py_False, "cuda_archs", kCudaArchs, "cpu_isa",
                       fused_amp::cpu::loops().isa, "cpu_bf16_conversion", bf16 ? Py_True : Py_False);
}

// The optimizers of step_ (optimizers.h), for the Python layer:
// {name: {"states": [(state key, op list name, signed 8-bit map), ...], "hyper": [name, ...],
//  "scalar": the key of its per-tensor scalar state, or None, "scalar_initial": that state's first
//  value, "writes_output": whether it writes `outputs` instead of the params (ops/optimizer.h)}}.
PyObject* optimizers(PyObject*, PyObject*) {
  PyObject* table = PyDict_New();
  fused_amp::Optimizers::for_each([&]<class Opt>() {
    PyObject* states = PyList_New(Opt::kStates);
    for (int k = 0; k < Opt::kStates; ++k) {
      const fused_amp::ops::StateInfo& info = Opt::kStateInfo[k];
      PyList_SET_ITEM(states, k, Py_BuildValue("(ssO)", info.key, info.name, info.is_signed ? Py_True : Py_False));
    }
    constexpr int count = fused_amp::ops::kHyperCount<Opt>;
    PyObject* hyper = PyList_New(count);
    for (int k = 0; k < count; ++k) PyList_SET_ITEM(hyper, k, PyUnicode_FromString(Opt::kHyperFields[k].name));
    PyObject* scalar = Opt::kScalarKey ? PyUnicode_FromString(Opt::kScalarKey) : Py_NewRef(Py_None);
    PyObject* entry = Py_BuildValue("{s:N,s:N,s:N,s:d,s:O}", "states", states, "hyper", hyper, "scalar", scalar,
                                    "scalar_initial", Opt::kScalarInitial, "writes_output",
                                    Opt::kWritesOutput ? Py_True : Py_False);
    PyDict_SetItemString(table, Opt::kName, entry);
    Py_DECREF(entry);
  });
  return table;
}

// The storage kinds (storage_kinds.h), for the Python layer: {"masters": [entry, ...], "states":
// [entry, ...]}, each entry {"kind": its MasterKind or StateKind value, "option", "key", "dtype",
// "bits", "block", "bf16_params", "rounds"} (key None for state).
PyObject* storage_kinds(PyObject*, PyObject*) {
  auto entries = [](const auto& table) {
    PyObject* list = PyList_New(0);
    for (const fused_amp::StorageKind& k : table) {
      PyObject* key = k.key ? PyUnicode_FromString(k.key) : Py_NewRef(Py_None);
      PyObject* entry = Py_BuildValue("{s:i,s:s,s:N,s:s,s:i,s:i,s:O,s:O}", "kind", k.kind, "option", k.option, "key",
                                      key, "dtype", k.dtype, "bits", k.bits, "block", k.block, "bf16_params",
                                      k.bf16_params ? Py_True : Py_False, "rounds", k.rounds ? Py_True : Py_False);
      PyList_Append(list, entry);
      Py_DECREF(entry);
    }
    return list;
  };
  return Py_BuildValue("{s:N,s:N}", "masters", entries(fused_amp::kMasterKinds), "states",
                       entries(fused_amp::kStateKinds));
}

// kept_states(name, hyper): the indices into the table's "states" of those the step of `name` keeps
// with these hyperparameters (in its "hyper" order): the descriptor's state_mask.
PyObject* kept_states(PyObject*, PyObject* args) {
  const char* name = nullptr;
  PyObject* values = nullptr;
  if (!PyArg_ParseTuple(args, "sO", &name, &values)) return nullptr;
  PyObject* kept = nullptr;
  const bool known = fused_amp::Optimizers::find(name, [&]<class Opt>() {
    constexpr int count = fused_amp::ops::kHyperCount<Opt>;
    double hyper[count] = {};
    if (PySequence_Length(values) != count) {
      PyErr_Format(PyExc_ValueError, "kept_states: %s takes %d hyperparameters", name, count);
      return;
    }
    for (int k = 0; k < count; ++k) {
      PyObject* item = PySequence_GetItem(values, k);
      hyper[k] = item ? PyFloat_AsDouble(item) : -1.0;
      Py_XDECREF(item);
      if (PyErr_Occurred()) return;
    }
    const unsigned mask = Opt::state_mask(fused_amp::ops::hyper_of<Opt>(hyper));
    kept = PyList_New(0);
    for (int k = 0; k < Opt::kStates; ++k) {
      if (!(mask >> k & 1u)) continue;
      PyObject* index = PyLong_FromLong(k);
      PyList_Append(kept, index);
      Py_DECREF(index);
    }
  });
  if (!known) PyErr_Format(PyExc_ValueError, "kept_states: unknown optimizer '%s'", name);
  return kept;
}

// For the CUDA tests: force the 4 KB or the 32 KB kernel-argument plan (0: automatic).
PyObject* set_kernel_arg_bytes(PyObject*, PyObject* arg) {
  const long bytes = PyLong_AsLong(arg);
  if (bytes == -1 && PyErr_Occurred()) return nullptr;
#ifdef FUSED_AMP_WITH_CUDA
  try {
    fused_amp::cuda::set_kernel_arg_bytes(static_cast<int>(bytes));
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
#else
  PyErr_SetString(PyExc_RuntimeError, "fused_amp was built without CUDA kernels");
  return nullptr;
#endif
}

}  // namespace

// The ops return nothing and are not differentiable (the optimizers call them under no_grad):
// autograd has nothing to do. Without a kernel of their own for the Autograd key, the
// dispatcher boxed every call into torch's not-implemented fallback, which reads requires_grad
// of every tensor argument for a warning it attaches to outputs only: 0.2 us per param of an
// 800-param step on the CPU. The checks alike (the step checks every group's lists before the
// first group's op runs: 1,000 params on the CPU, 478-485 us of checks through the fallback,
// 175-179 us without). (Versions are bumped by the entries, ops_impl.h.)
namespace {
void register_fallthrough(torch::Library& m) {
  for (const char* op : kOps) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
}  // namespace

TORCH_LIBRARY_IMPL(fused_amp, Autograd, m) { register_fallthrough(m); }
TORCH_LIBRARY_IMPL(fused_amp_check, Autograd, m) { register_fallthrough(m); }
TORCH_LIBRARY_IMPL(fused_amp, SparseCPU, m) { register_sparse_rejection(m); }
TORCH_LIBRARY_IMPL(fused_amp, SparseCUDA, m) { register_sparse_rejection(m); }

namespace {

PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS, "How this extension was built and what it runs."},
    {"optimizers", optimizers, METH_NOARGS,
     "The optimizers of the step_ op: their states (key, list name, signed 8-bit map) and hyperparameters."},
    {"storage_kinds", storage_kinds, METH_NOARGS,
     "The storage kinds of masters and optimizer state: option values, state keys, dtypes (storage_kinds.h)."},
    {"kept_states", kept_states, METH_VARARGS,
     "The indices of the states the step of an optimizer keeps with these hyperparameters (its state_mask)."},
    {"hold_refs", fused_amp::hold_refs, METH_O,
     "C++ references to a sequence of tensors (None skipped), held by the object returned."},
    {"local_grads", fused_amp::local_grads, METH_VARARGS,
     "(grads, DTensor specs, DTensor count, common device, refs, spec of each grad) of a list of params (py_lists.h)."},
    {"lists_unchanged", fused_amp::lists_unchanged, METH_VARARGS,
     "Whether an optimizer's cached lists of a group still hold (py_lists.h)."},
    {"call_step", fused_amp::call_step, METH_VARARGS,
     "torch.ops.fused_amp.step_ (or its check) on its parts, unboxed; NotImplemented where torch.ops must (py_step.h)."},
    {"_set_kernel_arg_bytes", set_kernel_arg_bytes, METH_O,
     "Force the CUDA kernel-argument plan: 4096, 32768, or 0 for automatic (tests only)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
