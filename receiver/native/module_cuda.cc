// The module's functions over the CUDA transport (cuda_api.h,
// cuda_copies.h, ffi_cuda.cc): its FFI handlers, loading the CUDA runtime,
// its statistics, and what a buffers=True call's GPU buffers need
// (receiver/device_buffers.py): DLPack exports (python_dlpack.h), the copy
// of a result on the device and a stream's synchronization. Built without CUDA: nothing here runs on a machine
// without a GPU unless a test installs the stand-in (module_testing.cc).

#include "module_support.h"

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_api.h"
#include "ffi_cuda.h"
#include "ffi_targets.h"
#include "hub.h"
#include "python_dlpack.h"

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

// dlpack_capsule(owner, address, shape, code, bits, device_type,
// device_id, read_only, versioned): a capsule over that memory that holds
// `owner`.
PyObject* DlpackCapsuleBinding(PyObject*, PyObject* args) {
  PyObject *owner, *shape;
  unsigned long long address;
  int code, bits, device_type, device_id, read_only, versioned;
  if (!PyArg_ParseTuple(args, "OKOiiiipp", &owner, &address, &shape, &code,
                        &bits, &device_type, &device_id, &read_only,
                        &versioned)) {
    return nullptr;
  }
  DlpackView view{reinterpret_cast<void*>(address), {},
                  static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                  device_type, device_id, read_only != 0};
  if (!Int64s(shape, &view.shape)) return nullptr;
  return DlpackCapsule(owner, view, versioned != 0);
}

// cuda_copy_on_device(dst, src, bytes, stream): a copy enqueued on the
// stream, GPU memory to GPU memory.
PyObject* CudaCopyOnDevice(PyObject*, PyObject* args) {
  unsigned long long dst, src, bytes, stream;
  if (!PyArg_ParseTuple(args, "KKKK", &dst, &src, &bytes, &stream)) {
    return nullptr;
  }
  return NoneOrRaise(hcb::CopyOnDevice(
      reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
      static_cast<size_t>(bytes), reinterpret_cast<void*>(stream)));
}

PyObject* CudaSynchronize(PyObject*, PyObject* arg) {
  const unsigned long long stream = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  hcb::Status status;
  WithoutGil([&] {
    status = hcb::SynchronizeStream(reinterpret_cast<void*>(stream));
  });
  return NoneOrRaise(status);
}

}  // namespace

PyMethodDef kCudaMethods[] = {
    {"cuda_ffi_handlers", CudaFfiHandlers, METH_NOARGS, nullptr},
    {"cuda_load", CudaLoad, METH_VARARGS, nullptr},
    {"cuda_stats", CudaStats, METH_O, nullptr},
    {"cuda_pool_stats", CudaPoolStats, METH_NOARGS, nullptr},
    {"dlpack_capsule", DlpackCapsuleBinding, METH_VARARGS, nullptr},
    {"cuda_copy_on_device", CudaCopyOnDevice, METH_VARARGS, nullptr},
    {"cuda_synchronize", CudaSynchronize, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
