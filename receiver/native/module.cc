// host_callback.receiver._native: the CPython extension module of the
// native core. This file makes the module: it adds the functions of its
// parts (module_queues.cc: queues, sites, replies, executions and the CPU's
// FFI handlers; module_cuda.cc: the CUDA transport; module_testing.cc:
// tests only; python_hooks.cc: the hooks into Python; python_instances.cc:
// new_instance, instance_feed), the Memory type
// (python_memory.h), and the constants the Python side reads instead of
// writing them again. The Python side is receiver/native_library.py,
// receiver/transport_native.py and receiver/instances.py.

#include "module_support.h"

#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <chrono>
#include <cstdint>

#include "calls.h"
#include "cuda_copies.h"
#include "device_queue.h"
#include "ffi_common.h"
#include "ffi_targets.h"
#include "packet.h"
#include "python_memory.h"
#include "python_runner.h"
#include "waits.h"
#include "xla/ffi/api/c_api.h"

namespace {

// Bumped whenever a function's signature changes (the module's
// ABI_VERSION, which receiver/native_library.py checks).
constexpr int kAbiVersion = 31;

// Adds `name` = `value` (a new reference, or null with an exception set)
// to `module`; false with an exception set.
bool AddConstant(PyObject* module, const char* name, PyObject* value) {
  if (value == nullptr) return false;
  if (PyModule_AddObject(module, name, value) < 0) {
    Py_DECREF(value);
    return false;
  }
  return true;
}

// RUN_SLOTS: (RAN, RUNNING, BEGUN_QUEUED, REFUSED, SLOTS), the layout of a
// queue's counts (python_runner.h:RunSlot, receiver/run_counts.py).
PyObject* RunSlots() {
  using hcb::python::RunSlot;
  return Py_BuildValue("(iiiii)", RunSlot::kRan, RunSlot::kRunning,
                       RunSlot::kBegunQueued, RunSlot::kRefused,
                       RunSlot::kRunSlots);
}

// PACKED_BITS: {numpy dtype name: bits per element} of the dtypes XLA
// packs below a byte (ffi_common.h:kPackedDtypes).
PyObject* PackedBits() {
  PyObject* packed = PyDict_New();
  if (packed == nullptr) return nullptr;
  for (const hcb::PackedDtype& dtype : hcb::kPackedDtypes) {
    PyObject* bits = PyLong_FromLong(dtype.bits);
    const bool added = bits != nullptr &&
                       PyDict_SetItemString(packed, dtype.numpy_name, bits) == 0;
    Py_XDECREF(bits);
    if (!added) {
      Py_DECREF(packed);
      return nullptr;
    }
  }
  return packed;
}

bool AddTargetNames(PyObject* module) {
  return PyModule_AddStringConstant(module, "OUTFEED_TARGET",
                                    hcb::kOutfeedTarget) == 0 &&
         PyModule_AddStringConstant(module, "CALL_TARGET",
                                    hcb::kCallTarget) == 0 &&
         PyModule_AddStringConstant(module, "TAP_SYNC_TARGET",
                                    hcb::kTapSyncTarget) == 0 &&
         PyModule_AddStringConstant(module, "BEGIN_TARGET",
                                    hcb::kBeginTarget) == 0 &&
         PyModule_AddStringConstant(module, "END_TARGET",
                                    hcb::kEndTarget) == 0;
}

bool AddConstants(PyObject* module) {
  const double guest_grace_seconds =
      std::chrono::duration<double>(hcb::kGuestGrace).count();
  const double poll_seconds =
      std::chrono::duration<double>(hcb::kPollInterval).count();
  return PyModule_AddIntConstant(module, "ABI_VERSION", kAbiVersion) == 0 &&
         // The XLA FFI API version of the headers the handlers were built
         // with (third_party/xla): XLA accepts them when it is at most its
         // own.
         AddConstant(module, "XLA_FFI_API_VERSION",
                     Py_BuildValue("(ii)", XLA_FFI_API_MAJOR,
                                   XLA_FFI_API_MINOR)) &&
         AddConstant(module, "HEADER_BYTES",
                     PyLong_FromLongLong(hcb::kHeaderBytes)) &&
         AddConstant(module, "ALIGN_BYTES", PyLong_FromLongLong(hcb::kAlign)) &&
         AddConstant(module, "LARGE_PACKET_BYTES",
                     PyLong_FromLongLong(hcb::kLargePacket)) &&
         AddConstant(module, "INDEX_COLUMNS",
                     PyLong_FromLongLong(sizeof(hcb::IndexEntry) /
                                         sizeof(int64_t))) &&
         AddConstant(module, "REPLY_SIZE_MISMATCH",
                     PyLong_FromLong(static_cast<long>(
                         hcb::ReplyOutcome::kSizeMismatch))) &&
         AddConstant(module, "CUDA_QUEUE_BASE",
                     PyLong_FromLongLong(hcb::kCudaQueueBase)) &&
         AddConstant(module, "GUEST_GRACE_SECONDS",
                     PyFloat_FromDouble(guest_grace_seconds)) &&
         AddConstant(module, "POLL_SECONDS",
                     PyFloat_FromDouble(poll_seconds)) &&
         AddConstant(module, "PACKED_BITS", PackedBits()) &&
         PyModule_AddStringConstant(module, "CTRL_C_CANCELLED",
                                    hcb::kCtrlCCancelled) == 0 &&
         AddConstant(module, "RUN_SLOTS", RunSlots()) &&
         AddTargetNames(module);
}

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native",
    "The native core of host_callback's receiver (see "
    "receiver/native_library.py).",
    -1, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  import_array();
  if (!hcb::python::ReadyMemoryType()) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  auto* memory_type = reinterpret_cast<PyObject*>(hcb::python::MemoryType);
  Py_INCREF(memory_type);
  if (!AddConstant(module, "Memory", memory_type) ||
      PyModule_AddFunctions(module, hcb::python::kQueueMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kHookMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kIdleCheckMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kInstanceMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kConsumeMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kPlainTapMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kCudaMethods) < 0 ||
      PyModule_AddFunctions(module, hcb::python::kTestingMethods) < 0 ||
      !AddConstants(module)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
