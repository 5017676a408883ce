// The module's functions over the queues and sites: the receiver attaching
// and detaching, the sites' registration, a consumer's batches and
// releases, a guest's packet, the waits and statistics of barriers, the
// replies to requests, the executions counts, the dispatches' hook and the
// CPU's FFI handlers. The Python side is receiver/native_library.py and
// receiver/transport_native.py.

#include "module_support.h"

#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#include "python_sites.h"

#include <cstdint>
#include <vector>

#include "dispatched_outputs.h"
#include "dispatches.h"
#include "executions.h"
#include "ffi_cpu.h"
#include "ffi_targets.h"
#include "hub.h"
#include "python_limited.h"

namespace hcb::python {
namespace {

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

// note_dispatch(function, args, kwargs, output): JAX's dispatch reports
// one, and what it output (dispatched_outputs.h); other arguments are
// counted alike and their outputs not noted.
PyObject* NoteDispatch(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                       PyObject*) {
  hcb::Dispatches& dispatches = hcb::Dispatches::Get();
  dispatches.Note();
  NoteDispatchedOutput(nargs == 4 ? args[3] : nullptr,
                       dispatches.OnThisThread());
  Py_RETURN_NONE;
}

PyObject* AttachReceiver(PyObject*, PyObject* args) {
  long long max_bytes;
  if (!PyArg_ParseTuple(args, "L", &max_bytes)) return nullptr;
  hub().Attach(max_bytes);
  Py_RETURN_NONE;
}

PyObject* DetachReceiver(PyObject*, PyObject*) {
  return PyBool_FromLong(hub().Detach());
}

PyObject* WakeConsumers(PyObject*, PyObject*) {
  hub().WakeConsumers();
  Py_RETURN_NONE;
}

PyObject* RegisterSiteBinding(PyObject*, PyObject* args) {
  long long site;
  PyObject *sizes_list, *entry, *name, *dtypes, *shapes, *unpackers, *ints;
  int copy, pack_results, buffers;
  if (!PyArg_ParseTuple(args, "LOOUOOOOppp", &site, &sizes_list, &entry,
                        &name, &dtypes, &shapes, &unpackers, &ints, &copy,
                        &pack_results, &buffers)) {
    return nullptr;
  }
  std::vector<int64_t> sizes;
  if (!Int64s(sizes_list, &sizes)) return nullptr;
  if (!hcb::python::RegisterSite(site, sizes, entry, name, dtypes, shapes,
                                 unpackers, ints, copy != 0, pack_results != 0,
                                 buffers != 0)) {
    return nullptr;
  }
  return CatchToPython([&] {
    hub().sites().Register(site, sizes, buffers != 0);
    Py_RETURN_NONE;
  });
}

PyObject* UnregisterSiteBinding(PyObject*, PyObject* arg) {
  const long long site = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  hcb::python::UnregisterSite(site);
  return PyBool_FromLong(hub().sites().Unregister(site));
}

PyObject* OpenDevice(PyObject*, PyObject* arg) {
  const long long device_id = PyLong_AsLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return CatchToPython([&] {
    hub().Queue(device_id);
    Py_RETURN_NONE;
  });
}

PyObject* Release(PyObject*, PyObject* args) {
  long long device_id, packets, bytes;
  if (!PyArg_ParseTuple(args, "LLL", &device_id, &packets, &bytes)) {
    return nullptr;
  }
  return CatchToPython([&] {
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
  return CatchToPython([&]() -> PyObject* {
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
  return CatchToPython([&]() -> PyObject* {
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
  return CatchToPython([&] {
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
  return CatchToPython([&]() -> PyObject* {
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
  return CatchToPython([&] {
    const hcb::DeviceQueue::Stats stats = hub().Queue(device_id)->ReadStats();
    return Py_BuildValue("(LLLL)", static_cast<long long>(stats.bytes),
                         static_cast<long long>(stats.waiting),
                         static_cast<long long>(stats.high_water),
                         static_cast<long long>(stats.enqueued));
  });
}

PyObject* Drained(PyObject*, PyObject*) {
  return CatchToPython([&] { return PyBool_FromLong(hub().Drained()); });
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
  const Py_ssize_t count = FastSize(sequence);
  std::vector<Py_buffer> buffers;
  buffers.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(FastItem(sequence, i), &buffer,
                           PyBUF_C_CONTIGUOUS) < 0) {
      for (Py_buffer& taken : buffers) PyBuffer_Release(&taken);
      Py_DECREF(sequence);
      return nullptr;
    }
    buffers.push_back(buffer);
  }
  PyObject* outcome = CatchToPython([&]() -> PyObject* {
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
  return CatchToPython([&] {
    return PyBool_FromLong(hub().calls().ReplyError(request_id, message));
  });
}

PyObject* FfiHandlers(PyObject*, PyObject*) {
  return Py_BuildValue("{sNsNsNsNsN}", kOutfeedTarget, Capsule(HcbOutfeed),
                       kCallTarget, Capsule(HcbCall), kTapSyncTarget,
                       Capsule(HcbTapSync), kBeginTarget, Capsule(HcbBegin),
                       kEndTarget, Capsule(HcbEnd));
}

}  // namespace

PyMethodDef kQueueMethods[] = {
    {"executions", Executions, METH_NOARGS, nullptr},
    {"reset_executions_low_water", ResetExecutionsLowWater, METH_NOARGS,
     nullptr},
    {"execution_failed", ExecutionFailed, METH_NOARGS, nullptr},
    {"note_dispatch", reinterpret_cast<PyCFunction>(
                          reinterpret_cast<void (*)()>(NoteDispatch)),
     METH_FASTCALL | METH_KEYWORDS, nullptr},
    {"attach", AttachReceiver, METH_VARARGS, nullptr},
    {"detach", DetachReceiver, METH_NOARGS, nullptr},
    {"wake_consumers", WakeConsumers, METH_NOARGS, nullptr},
    {"register_site", RegisterSiteBinding, METH_VARARGS, nullptr},
    {"unregister_site", UnregisterSiteBinding, METH_O, nullptr},
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
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
