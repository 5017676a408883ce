// host_callback.receiver._native: the CPython extension module over the hub
// (hub.h: queues, pool, replies, sites), the executions count and the
// direct runner; the functions that set the hooks into Python are in
// python_hooks.cc. The Python side is receiver/native_library.py (docs of
// each function) and receiver/transport_native.py.
//
// Every function that waits or copies much releases the GIL meanwhile. C++
// exceptions become Python exceptions: std::bad_alloc a MemoryError, any
// other a RuntimeError.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cuda_api.h"
#include "executions.h"
#include "ffi_cpu.h"
#include "ffi_cuda.h"
#include "hub.h"
#include "py_memory.h"
#include "python_hooks.h"
#include "python_limited.h"
#include "python_sites.h"

namespace {

// Bumped whenever a function's signature below changes (the module's
// ABI_VERSION, which receiver/native_library.py checks).
constexpr int kAbiVersion = 12;

hcb::Hub& hub() { return hcb::Hub::Get(); }

// Runs `body()`, which returns a new reference; a C++ exception becomes a
// Python exception.
template <typename Body>
PyObject* Guard(Body body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError,
                    (std::string("host_callback native: ") + error.what())
                        .c_str());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError,
                    "host_callback native: an unknown C++ exception");
  }
  return nullptr;
}

// Runs `body()` with the GIL released; its C++ exception is rethrown once
// the GIL is back.
template <typename Body>
void WithoutGil(Body body) {
  std::exception_ptr failure;
  Py_BEGIN_ALLOW_THREADS
  try {
    body();
  } catch (...) {
    failure = std::current_exception();
  }
  Py_END_ALLOW_THREADS
  if (failure) std::rethrow_exception(failure);
}

// A list of Python ints as int64s; false with an exception set.
bool Int64s(PyObject* list, std::vector<int64_t>* out) {
  PyObject* sequence = PySequence_Fast(list, "expected a sequence of ints");
  if (sequence == nullptr) return false;
  const Py_ssize_t count = hcb::python::FastSize(sequence);
  out->resize(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    (*out)[static_cast<size_t>(i)] =
        PyLong_AsLongLong(hcb::python::FastItem(sequence, i));
  }
  Py_DECREF(sequence);
  return !PyErr_Occurred();
}

// Raises RuntimeError with `status`'s message unless it is ok.
PyObject* NoneOrRaise(const hcb::Status& status) {
  if (status.ok()) Py_RETURN_NONE;
  PyErr_SetString(PyExc_RuntimeError, status.message.c_str());
  return nullptr;
}

// A sequence of (address, bytes) pairs as spans; false with an exception.
bool SpanList(PyObject* list, std::vector<hcb::Span>* out) {
  PyObject* sequence = PySequence_Fast(list, "expected (address, bytes) pairs");
  if (sequence == nullptr) return false;
  const Py_ssize_t count = hcb::python::FastSize(sequence);
  out->resize(static_cast<size_t>(count));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < count; ++i) {
    unsigned long long address;
    long long bytes;
    ok = PyArg_ParseTuple(hcb::python::FastItem(sequence, i), "KL",
                          &address, &bytes) != 0;
    (*out)[static_cast<size_t>(i)] = {reinterpret_cast<void*>(address),
                                      static_cast<int64_t>(bytes)};
  }
  Py_DECREF(sequence);
  return ok;
}

// --- Module functions ----------------------------------------------------

PyObject* Executions(PyObject*, PyObject*) {
  int64_t out[3];
  hcb::Executions::Get().Read(out);
  return Py_BuildValue("(LLL)", static_cast<long long>(out[0]),
                       static_cast<long long>(out[1]),
                       static_cast<long long>(out[2]));
}

PyObject* ResetExecutionsLowWater(PyObject*, PyObject*) {
  hcb::Executions::Get().ResetLowWater();
  Py_RETURN_NONE;
}

PyObject* ExecutionFailed(PyObject*, PyObject*) {
  hcb::Executions::Get().End();
  Py_RETURN_NONE;
}

PyObject* Attach(PyObject*, PyObject* args) {
  long long max_bytes;
  if (!PyArg_ParseTuple(args, "L", &max_bytes)) return nullptr;
  hub().Attach(max_bytes);
  Py_RETURN_NONE;
}

PyObject* Detach(PyObject*, PyObject*) {
  return PyBool_FromLong(hub().Detach());
}

PyObject* WakeConsumers(PyObject*, PyObject*) {
  hub().WakeConsumers();
  Py_RETURN_NONE;
}

PyObject* RegisterSite(PyObject*, PyObject* args) {
  long long site;
  PyObject *sizes_list, *entry, *name, *dtypes, *shapes, *unpackers;
  int copy, pack_results;
  if (!PyArg_ParseTuple(args, "LOOUOOOpp", &site, &sizes_list, &entry, &name,
                        &dtypes, &shapes, &unpackers, &copy, &pack_results)) {
    return nullptr;
  }
  std::vector<int64_t> sizes;
  if (!Int64s(sizes_list, &sizes)) return nullptr;
  if (!hcb::python::RegisterSite(site, sizes, entry, name, dtypes, shapes,
                                 unpackers, copy != 0, pack_results != 0)) {
    return nullptr;
  }
  return Guard([&] {
    hub().sites().Register(site, sizes);
    Py_RETURN_NONE;
  });
}

PyObject* UnregisterSite(PyObject*, PyObject* arg) {
  const long long site = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  hcb::python::UnregisterSite(site);
  return PyBool_FromLong(hub().sites().Unregister(site));
}

PyObject* OpenDevice(PyObject*, PyObject* arg) {
  const long long device_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return Guard([&] {
    hub().Queue(device_id);
    Py_RETURN_NONE;
  });
}

PyObject* Release(PyObject*, PyObject* args) {
  long long device_id, packets, bytes;
  if (!PyArg_ParseTuple(args, "LLL", &device_id, &packets, &bytes)) {
    return nullptr;
  }
  return Guard([&] {
    hub().Queue(device_id)->Release(packets, bytes);
    Py_RETURN_NONE;
  });
}

PyObject* Take(PyObject*, PyObject* args) {
  long long device_id, capacity, max_packets, released_packets, released_bytes;
  double timeout_s;
  unsigned long long dst, index;
  if (!PyArg_ParseTuple(args, "LdKLKLLL", &device_id, &timeout_s, &dst,
                        &capacity, &index, &max_packets, &released_packets,
                        &released_bytes)) {
    return nullptr;
  }
  return Guard([&]() -> PyObject* {
    int64_t count = 0, needed = 0;
    WithoutGil([&] {
      hcb::DeviceQueue* queue = hub().Queue(device_id);
      if (released_packets > 0) {
        queue->Release(released_packets, released_bytes);
      }
      count = queue->Take(timeout_s, reinterpret_cast<uint8_t*>(dst), capacity,
                          reinterpret_cast<hcb::IndexEntry*>(index),
                          max_packets, &needed);
    });
    return Py_BuildValue("(LL)", static_cast<long long>(count),
                         static_cast<long long>(needed));
  });
}

PyObject* TakeAsGuest(PyObject*, PyObject* args) {
  long long device_id, capacity;
  unsigned long long dst, index;
  if (!PyArg_ParseTuple(args, "LKLK", &device_id, &dst, &capacity, &index)) {
    return nullptr;
  }
  return Guard([&]() -> PyObject* {
    int64_t count = 0, needed = 0;
    WithoutGil([&] {
      count = hub().Queue(device_id)->TakeAsGuest(
          reinterpret_cast<uint8_t*>(dst), capacity,
          reinterpret_cast<hcb::IndexEntry*>(index), &needed);
    });
    return Py_BuildValue("(LL)", static_cast<long long>(count),
                         static_cast<long long>(needed));
  });
}

PyObject* EndGuest(PyObject*, PyObject* arg) {
  const long long device_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return Guard([&] {
    hub().Queue(device_id)->EndGuest();
    Py_RETURN_NONE;
  });
}

PyObject* WaitFinished(PyObject*, PyObject* args) {
  long long device_id, target;
  double timeout_s;
  if (!PyArg_ParseTuple(args, "LLd", &device_id, &target, &timeout_s)) {
    return nullptr;
  }
  return Guard([&]() -> PyObject* {
    bool reached = false;
    WithoutGil([&] {
      reached = hub().Queue(device_id)->WaitFinished(target, timeout_s);
    });
    return PyBool_FromLong(reached);
  });
}

PyObject* Stats(PyObject*, PyObject* arg) {
  const long long device_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return Guard([&] {
    hcb::DeviceQueue* queue = hub().Queue(device_id);
    std::lock_guard<std::mutex> lock(queue->mu);
    return Py_BuildValue("(LLLL)", static_cast<long long>(queue->bytes),
                         static_cast<long long>(queue->enqueued -
                                                queue->finished),
                         static_cast<long long>(queue->high_water),
                         static_cast<long long>(queue->enqueued));
  });
}

PyObject* Drained(PyObject*, PyObject*) {
  return Guard([&] { return PyBool_FromLong(hub().Drained()); });
}

PyObject* PoolStats(PyObject*, PyObject*) {
  int64_t out[4];
  hub().pool().Stats(out);
  return Py_BuildValue("(LLLL)", static_cast<long long>(out[0]),
                       static_cast<long long>(out[1]),
                       static_cast<long long>(out[2]),
                       static_cast<long long>(out[3]));
}

PyObject* Reply(PyObject*, PyObject* args) {
  long long request_id;
  PyObject* arrays;
  if (!PyArg_ParseTuple(args, "LO", &request_id, &arrays)) return nullptr;
  PyObject* sequence = PySequence_Fast(arrays, "reply: expected a sequence");
  if (sequence == nullptr) return nullptr;
  const Py_ssize_t count = hcb::python::FastSize(sequence);
  std::vector<Py_buffer> buffers;
  buffers.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(hcb::python::FastItem(sequence, i), &buffer,
                           PyBUF_C_CONTIGUOUS) < 0) {
      for (Py_buffer& taken : buffers) PyBuffer_Release(&taken);
      Py_DECREF(sequence);
      return nullptr;
    }
    buffers.push_back(buffer);
  }
  PyObject* outcome = Guard([&]() -> PyObject* {
    std::vector<hcb::Span> results;
    for (Py_buffer& buffer : buffers) {
      results.push_back({buffer.buf, static_cast<int64_t>(buffer.len)});
    }
    hcb::ReplyOutcome delivered = hcb::ReplyOutcome::kNoWaiter;
    WithoutGil([&] {
      delivered =
          hub().calls().Reply(request_id, results.data(), results.size());
    });
    return PyLong_FromLong(static_cast<long>(delivered));
  });
  for (Py_buffer& buffer : buffers) PyBuffer_Release(&buffer);
  Py_DECREF(sequence);
  return outcome;
}

PyObject* ReplyError(PyObject*, PyObject* args) {
  long long request_id;
  const char* message;
  if (!PyArg_ParseTuple(args, "Ls", &request_id, &message)) return nullptr;
  return Guard([&] {
    return PyBool_FromLong(hub().calls().ReplyError(request_id, message));
  });
}

PyObject* Capsule(XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*)) {
  return PyCapsule_New(reinterpret_cast<void*>(handler), nullptr, nullptr);
}

PyObject* FfiHandlers(PyObject*, PyObject*) {
  return Py_BuildValue(
      "{sNsNsNsNsN}", "host_callback_outfeed", Capsule(HcbOutfeed),
      "host_callback_call", Capsule(HcbCall), "host_callback_tap_sync",
      Capsule(HcbTapSync), "host_callback_begin", Capsule(HcbBegin),
      "host_callback_end", Capsule(HcbEnd));
}

PyObject* CudaFfiHandlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsN}", "host_callback_outfeed",
                       Capsule(HcbCudaOutfeed), "host_callback_call",
                       Capsule(HcbCudaCall));
}

PyObject* CudaLoad(PyObject*, PyObject* args) {
  const char* path = nullptr;
  if (!PyArg_ParseTuple(args, "z", &path)) return nullptr;
  return Guard([&] { return NoneOrRaise(hcb::LoadCudaApi(path)); });
}

PyObject* CudaStats(PyObject*, PyObject* arg) {
  const long long ordinal = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return Guard([&] {
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

// Tests only (tests/test_cuda_transport.py): the CUDA stand-in, and a tap or
// a call made as the CUDA handlers make them, with host memory for "device"
// memory and a stand-in stream.
PyObject* TestingCudaStandIn(PyObject*, PyObject* args) {
  const char* path;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  return Guard([&] { return NoneOrRaise(hcb::InstallCudaStandIn(path)); });
}

PyObject* TestingCudaTap(PyObject*, PyObject* args) {
  long long ordinal, site;
  unsigned long long stream;
  PyObject* arrays;
  if (!PyArg_ParseTuple(args, "LKLO", &ordinal, &stream, &site, &arrays)) {
    return nullptr;
  }
  std::vector<hcb::Span> spans;
  if (!SpanList(arrays, &spans)) return nullptr;
  return Guard([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().CudaSend(ordinal, reinterpret_cast<void*>(stream), site,
                              spans.data(), spans.size());
    });
    return NoneOrRaise(status);
  });
}

PyObject* TestingCudaCall(PyObject*, PyObject* args) {
  long long ordinal, site;
  unsigned long long stream;
  PyObject *arrays, *results;
  if (!PyArg_ParseTuple(args, "LKLOO", &ordinal, &stream, &site, &arrays,
                        &results)) {
    return nullptr;
  }
  std::vector<hcb::Span> spans, outputs;
  if (!SpanList(arrays, &spans) || !SpanList(results, &outputs)) {
    return nullptr;
  }
  return Guard([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().CudaCall(ordinal, reinterpret_cast<void*>(stream), site,
                              spans.data(), spans.size(), outputs.data(),
                              outputs.size());
    });
    return NoneOrRaise(status);
  });
}

PyMethodDef methods[] = {
    {"executions", Executions, METH_NOARGS, nullptr},
    {"reset_executions_low_water", ResetExecutionsLowWater, METH_NOARGS,
     nullptr},
    {"execution_failed", ExecutionFailed, METH_NOARGS, nullptr},
    {"attach", Attach, METH_VARARGS, nullptr},
    {"detach", Detach, METH_NOARGS, nullptr},
    {"wake_consumers", WakeConsumers, METH_NOARGS, nullptr},
    // Hooks into Python (python_hooks.cc).
    {"set_restart_hook", hcb::python::SetRestartHook, METH_O, nullptr},
    {"set_nested_consumer", hcb::python::SetNestedConsumer, METH_O, nullptr},
    {"set_direct_runner", hcb::python::SetDirectRunner, METH_VARARGS, nullptr},
    {"set_interrupt_thread", hcb::python::SetInterruptThread, METH_VARARGS,
     nullptr},
    {"register_site", RegisterSite, METH_VARARGS, nullptr},
    {"unregister_site", UnregisterSite, METH_O, nullptr},
    {"open_device", OpenDevice, METH_O, nullptr},
    {"release", Release, METH_VARARGS, nullptr},
    {"take", Take, METH_VARARGS, nullptr},
    {"take_as_guest", TakeAsGuest, METH_VARARGS, nullptr},
    {"end_guest", EndGuest, METH_O, nullptr},
    {"wait_finished", WaitFinished, METH_VARARGS, nullptr},
    {"stats", Stats, METH_O, nullptr},
    {"drained", Drained, METH_NOARGS, nullptr},
    {"pool_stats", PoolStats, METH_NOARGS, nullptr},
    {"reply", Reply, METH_VARARGS, nullptr},
    {"reply_error", ReplyError, METH_VARARGS, nullptr},
    {"ffi_handlers", FfiHandlers, METH_NOARGS, nullptr},
    // The CUDA transport (cuda_api.h, cuda_copies.h, ffi_cuda.cc).
    {"cuda_ffi_handlers", CudaFfiHandlers, METH_NOARGS, nullptr},
    {"cuda_load", CudaLoad, METH_VARARGS, nullptr},
    {"cuda_stats", CudaStats, METH_O, nullptr},
    {"cuda_pool_stats", CudaPoolStats, METH_NOARGS, nullptr},
    {"_testing_cuda_standin", TestingCudaStandIn, METH_VARARGS, nullptr},
    {"_testing_cuda_tap", TestingCudaTap, METH_VARARGS, nullptr},
    {"_testing_cuda_call", TestingCudaCall, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native",
    "The native core of host_callback's receiver (see "
    "receiver/native_library.py).",
    -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  import_array();
  if (!hcb::python::ReadyMemoryType()) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  auto* memory_type = reinterpret_cast<PyObject*>(hcb::python::MemoryType);
  Py_INCREF(memory_type);
  if (PyModule_AddObject(module, "Memory", memory_type) < 0) {
    Py_DECREF(memory_type);
    Py_DECREF(module);
    return nullptr;
  }
  // The XLA FFI API version of the headers the handlers were built with
  // (third_party/xla): XLA accepts them when it is at most its own.
  PyObject* ffi_api_version =
      Py_BuildValue("(ii)", XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  if (PyModule_AddIntConstant(module, "ABI_VERSION", kAbiVersion) < 0 ||
      ffi_api_version == nullptr ||
      PyModule_AddObject(module, "XLA_FFI_API_VERSION", ffi_api_version) < 0) {
    Py_XDECREF(ffi_api_version);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
