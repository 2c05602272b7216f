// The Python module fairseq_lightseq._C. Importing it runs the registrations of every op file linked into
// it: this file claims the op namespace (TORCH_LIBRARY), each family's csrc/ops/<family>.cpp adds its ops
// (TORCH_LIBRARY_FRAGMENT) and their CPU and CUDA implementations. build_info() says how it was built.
#include <Python.h>
#include <torch/library.h>

#include "ops/device.h"

#ifndef FLS_CUDA_ARCHS
#define FLS_CUDA_ARCHS ""
#endif
#ifndef FLS_TORCH_VERSION
#define FLS_TORCH_VERSION ""
#endif

TORCH_LIBRARY(fairseq_lightseq, m) {}

static PyObject* build_info(PyObject*, PyObject*) {
#ifdef FLS_WITH_CUDA
  const int with_cuda = 1;
#else
  const int with_cuda = 0;
#endif
  return Py_BuildValue("{s:O,s:s,s:s,s:s}", "with_cuda", with_cuda ? Py_True : Py_False, "cuda_archs",
                       FLS_CUDA_ARCHS, "torch_version", FLS_TORCH_VERSION, "compiler", __VERSION__);
}

// Switches the emulated CUDA device on or off (fairseq_lightseq/ops/_backend.py's emulated_cuda, for tests):
// only a CPU build into whose process the emulated library was loaded first has it.
static PyObject* set_cuda_emulation(PyObject*, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  if (on && (fls::kWithCuda || &fls::cuda::emulated_device == nullptr)) {
    PyErr_SetString(PyExc_RuntimeError,
                    fls::kWithCuda ? "the emulated CUDA device is for CPU builds; this build has the real one"
                                   : "the emulated CUDA library is not loaded (FLS_CUDA_EMULATION=1 before "
                                     "importing fairseq_lightseq, after `make emulated`)");
    return nullptr;
  }
  if (on) fls::poison_emulated_allocations();
  fls::g_cuda_emulation.store(on != 0);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS, "How the compiled library was built (dict)."},
    {"set_cuda_emulation", set_cuda_emulation, METH_O, "Runs the CUDA kernels on CPU tensors (emulated device)."},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "fairseq_lightseq compiled ops", -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module_def); }
