// The module's functions over the CUDA transport (cuda_api.h,
// cuda_copies.h, ffi_cuda.cc): its FFI handlers, loading the CUDA runtime,
// and its statistics. Built without CUDA: nothing here runs on a machine
// without a GPU unless a test installs the stand-in (module_testing.cc).

#include "module_support.h"

#include <cstdint>
#include <string>

#include "cuda_api.h"
#include "ffi_cuda.h"
#include "ffi_targets.h"
#include "hub.h"

namespace hcb::python {
namespace {

PyObject* CudaFfiHandlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsN}", kOutfeedTarget, Capsule(HcbCudaOutfeed),
                       kCallTarget, Capsule(HcbCudaCall));
}

PyObject* CudaLoad(PyObject*, PyObject* args) {
  const char* path = nullptr;
  if (!PyArg_ParseTuple(args, "z", &path)) return nullptr;
  return CatchToPython([&] { return NoneOrRaise(hcb::LoadCudaApi(path)); });
}

PyObject* CudaStats(PyObject*, PyObject* arg) {
  const long long ordinal = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return CatchToPython([&] {
    int64_t out[4];
    std::string failure;
    hub().cuda().Stats(ordinal, out, &failure);
    return Py_BuildValue("(LLLLs)", static_cast<long long>(out[0]),
                         static_cast<long long>(out[1]),
                         static_cast<long long>(out[2]),
                         static_cast<long long>(out[3]), failure.c_str());
  });
}

PyObject* CudaPoolStats(PyObject*, PyObject*) {
  int64_t out[4];
  hub().cuda().pool().Stats(out);
  return Py_BuildValue("(LLLL)", static_cast<long long>(out[0]),
                       static_cast<long long>(out[1]),
                       static_cast<long long>(out[2]),
                       static_cast<long long>(out[3]));
}

}  // namespace

PyMethodDef kCudaMethods[] = {
    {"cuda_ffi_handlers", CudaFfiHandlers, METH_NOARGS, nullptr},
    {"cuda_load", CudaLoad, METH_VARARGS, nullptr},
    {"cuda_stats", CudaStats, METH_O, nullptr},
    {"cuda_pool_stats", CudaPoolStats, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
