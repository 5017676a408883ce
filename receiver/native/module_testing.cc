// The module's functions for tests only: the CUDA stand-in, and a tap or a
// call made as the CUDA handlers make them, with host memory for "device"
// memory and a stand-in stream (tests/test_cuda_transport.py); a queue's
// pushes and claims as the device side makes them
// (tests/test_queue_protocol.py, which reaches the consumer's and guests'
// side through take, release, take_as_guest and end_guest); and the two
// copies of a site's layout that register_site makes, the direct runner's
// and the device threads' (tests/test_native_sites.py).

#include "module_support.h"

#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#include "python_gil.h"
#include "python_sites.h"

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "cuda_api.h"
#include "ffi_targets.h"
#include "hub.h"
#include "xla/ffi/api/ffi.h"

namespace hcb::python {
namespace {

PyObject* TestingCudaStandIn(PyObject*, PyObject* args) {
  const char* path;
  if (!PyArg_ParseTuple(args, "s", &path)) return nullptr;
  return CatchToPython([&] { return NoneOrRaise(hcb::InstallCudaStandIn(path)); });
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
  return CatchToPython([&] {
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
  return CatchToPython([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().CudaCall(ordinal, reinterpret_cast<void*>(stream), site,
                              spans.data(), spans.size(), outputs.data(),
                              outputs.size());
    });
    return NoneOrRaise(status);
  });
}

// Pushes a packet of no arrays whose site is `tag`, as a tap.
PyObject* TestingPush(PyObject*, PyObject* args) {
  long long device_id, tag;
  if (!PyArg_ParseTuple(args, "LL", &device_id, &tag)) return nullptr;
  return CatchToPython([&] {
    hcb::Status status;
    WithoutGil([&] {
      status = hub().Queue(device_id)->Push(tag, /*request_id=*/0, nullptr, 0);
    });
    return NoneOrRaise(status);
  });
}

// One of the queue's claim calls, made on the calling thread without the
// GIL: `call` returns bool or void.
template <typename Call>
PyObject* OnQueue(PyObject* arg, Call call) {
  const long long device_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return CatchToPython([&]() -> PyObject* {
    hcb::DeviceQueue* queue = hub().Queue(device_id);
    if constexpr (std::is_void_v<decltype(call(queue))>) {
      WithoutGil([&] { call(queue); });
      Py_RETURN_NONE;
    } else {
      bool result = false;
      WithoutGil([&] { result = call(queue); });
      return PyBool_FromLong(result);
    }
  });
}

PyObject* TestingClaimIfIdle(PyObject*, PyObject* arg) {
  return OnQueue(arg, [](hcb::DeviceQueue* q) { return q->ClaimIfIdle(); });
}
PyObject* TestingEndClaim(PyObject*, PyObject* arg) {
  return OnQueue(arg, [](hcb::DeviceQueue* q) { q->EndClaim(); });
}
PyObject* TestingSuspendClaim(PyObject*, PyObject* arg) {
  return OnQueue(arg, [](hcb::DeviceQueue* q) { return q->SuspendClaim(); });
}
PyObject* TestingResumeClaim(PyObject*, PyObject* arg) {
  return OnQueue(arg, [](hcb::DeviceQueue* q) { q->ResumeClaim(); });
}
PyObject* TestingConsumingOnThisThread(PyObject*, PyObject* arg) {
  return OnQueue(arg, [](hcb::DeviceQueue* q) {
    return q->ConsumingOnThisThread();
  });
}

// The direct runner's copy of a site (python_sites.h): (dtypes, shapes,
// byte sizes, unpackers, ints, copy, pack_results, buffers), or None.
PyObject* TestingRunnerSite(PyObject*, PyObject* arg) {
  const long long site_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  std::shared_ptr<const Site> site = FindSite(site_id);
  if (site == nullptr) Py_RETURN_NONE;
  const Py_ssize_t count = static_cast<Py_ssize_t>(site->columns.size());
  PyObject* dtypes = PyList_New(count);
  PyObject* shapes = PyList_New(count);
  PyObject* sizes = PyList_New(count);
  PyObject* unpackers = PyList_New(count);
  PyObject* ints = PyList_New(count);
  if (dtypes == nullptr || shapes == nullptr || sizes == nullptr ||
      unpackers == nullptr || ints == nullptr) {
    Py_XDECREF(dtypes);
    Py_XDECREF(shapes);
    Py_XDECREF(sizes);
    Py_XDECREF(unpackers);
    Py_XDECREF(ints);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    const Column& column = site->columns[static_cast<size_t>(i)];
    PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(column.dims.size()));
    for (size_t d = 0; shape != nullptr && d < column.dims.size(); ++d) {
      PyTuple_SetItem(shape, static_cast<Py_ssize_t>(d),
                      PyLong_FromLongLong(column.dims[d]));
    }
    PyObject* unpack = column.unpack != nullptr ? column.unpack : Py_None;
    Py_INCREF(reinterpret_cast<PyObject*>(column.descr));
    Py_INCREF(unpack);
    PyList_SetItem(dtypes, i, reinterpret_cast<PyObject*>(column.descr));
    PyList_SetItem(shapes, i, shape);
    PyList_SetItem(sizes, i, PyLong_FromLongLong(column.nbytes));
    PyList_SetItem(unpackers, i, unpack);
    PyList_SetItem(ints, i, PyBool_FromLong(column.as_int));
  }
  return Py_BuildValue("(NNNNNOOO)", dtypes, shapes, sizes, unpackers, ints,
                       site->copy ? Py_True : Py_False,
                       site->pack_results ? Py_True : Py_False,
                       site->buffers ? Py_True : Py_False);
}

// Whether the device threads' copy of a site (site_sizes.h) accepts arrays
// of these byte sizes: whether it takes buffers, else raises with
// SiteSizes::Check's error.
PyObject* TestingCheckSiteSizes(PyObject*, PyObject* args) {
  long long site_id;
  PyObject* sizes_list;
  if (!PyArg_ParseTuple(args, "LO", &site_id, &sizes_list)) return nullptr;
  std::vector<int64_t> sizes;
  if (!Int64s(sizes_list, &sizes)) return nullptr;
  std::vector<hcb::Span> spans;
  for (int64_t size : sizes) spans.push_back({nullptr, size});
  return CatchToPython([&] {
    hcb::Status status = hub().sites().Check(site_id, spans.data(),
                                             spans.size());
    if (!status.ok()) return NoneOrRaise(status);
    return PyBool_FromLong(hub().sites().TakesBuffers(site_id));
  });
}

namespace ffi = xla::ffi;

// The function that FloorPython calls: set by TestingFloorHandlers, owned.
PyObject* floor_function = nullptr;

// XLA's floor: a custom call that does nothing with its scalar operand.
ffi::Error FloorDispatch(ffi::AnyBuffer) { return ffi::Error::Success(); }

// Python's floor: the GIL taken and `floor_function()` called.
ffi::Error FloorPython(ffi::AnyBuffer) {
  bool called;
  {
    GilHeld gil;
    PyObject* result = PyObject_CallNoArgs(floor_function);
    called = result != nullptr;
    Py_XDECREF(result);
    if (!called) PyErr_Clear();
  }
  return called
             ? ffi::Error::Success()
             : ffi::Error(ffi::ErrorCode::kInternal, "the floor function raised");
}

XLA_FFI_DEFINE_HANDLER(kFloorDispatch, FloorDispatch,
                       ffi::Ffi::Bind().Arg<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER(kFloorPython, FloorPython,
                       ffi::Ffi::Bind().Arg<ffi::AnyBuffer>());

// Sets the function that the Python floor calls; returns ((target name,
// handler), ...) of the dispatch floor, then the Python floor (names in
// ffi_targets.h, handlers as capsules for jax.ffi.register_ffi_target).
PyObject* TestingFloorHandlers(PyObject*, PyObject* function) {
  if (!PyCallable_Check(function)) {
    PyErr_SetString(PyExc_TypeError, "the floor function must be callable");
    return nullptr;
  }
  Py_INCREF(function);
  PyObject* old = floor_function;
  floor_function = function;
  Py_XDECREF(old);
  return Py_BuildValue("((sN)(sN))", hcb::kFloorDispatchTarget,
                       Capsule(kFloorDispatch), hcb::kFloorPythonTarget,
                       Capsule(kFloorPython));
}

}  // namespace

PyMethodDef kTestingMethods[] = {
    {"_testing_cuda_standin", TestingCudaStandIn, METH_VARARGS, nullptr},
    {"_testing_cuda_tap", TestingCudaTap, METH_VARARGS, nullptr},
    {"_testing_cuda_call", TestingCudaCall, METH_VARARGS, nullptr},
    {"_testing_push", TestingPush, METH_VARARGS, nullptr},
    {"_testing_claim_if_idle", TestingClaimIfIdle, METH_O, nullptr},
    {"_testing_end_claim", TestingEndClaim, METH_O, nullptr},
    {"_testing_suspend_claim", TestingSuspendClaim, METH_O, nullptr},
    {"_testing_resume_claim", TestingResumeClaim, METH_O, nullptr},
    {"_testing_consuming_on_this_thread", TestingConsumingOnThisThread,
     METH_O, nullptr},
    {"_testing_runner_site", TestingRunnerSite, METH_O, nullptr},
    {"_testing_check_site_sizes", TestingCheckSiteSizes, METH_VARARGS,
     nullptr},
    {"_testing_floor_handlers", TestingFloorHandlers, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
