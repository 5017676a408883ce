// The direct runner: see python_runner.h.

#include "python_runner.h"

#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstring>
#include <memory>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "calls.h"
#include "hub.h"
#include "python_memory.h"
#include "python_limited.h"
#include "python_sites.h"

namespace hcb::python {
namespace {

PyObject* runner = nullptr;  // owned references, or null
PyObject* wire = nullptr;
PyObject* device_buffer = nullptr;
PyObject* consumers = nullptr;  // consumer id -> consumer: a dict, read only
PyObject* failed = nullptr;

// The runs of the consumers called here (CallConsumer), by device id: the
// runner counts its own. Guarded by the GIL; never erased, so that a run
// holds its entry while its consumer runs.
std::unordered_map<int64_t, OwnRuns> own_runs;

// How many direct runs' runner calls the calling thread is inside (a host
// function may run JAX code that runs another): RunsHostFunctionHere.
thread_local int runner_calls_here = 0;

// Arguments of a large request are copied into one block of the hub's pool
// (memory already touched: no page faults), as large packets are.
constexpr int64_t kAlignBytes = 64;

int64_t AlignUp64(int64_t n) {
  return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

// A Python exception's text, as the device reports it: a message of ours
// (DirectRunError's names the host function and holds its traceback,
// packets.error_message) as it is, another one prefixed by its type.
std::string Describe(PyObject* value) {
  std::string text = "host_callback: a host function failed";
  if (value == nullptr) return text;
  PyObject* str = PyObject_Str(value);
  if (str == nullptr) {
    PyErr_Clear();
    return text;
  }
  const char* utf8 = Utf8(str);
  if (utf8 == nullptr) {
    PyErr_Clear();
  } else if (std::strncmp(utf8, "host_callback", 13) == 0) {
    text = utf8;
  } else {
    PyObject* type_name = PyType_GetName(Py_TYPE(value));
    const char* type_utf8 = type_name != nullptr ? Utf8(type_name) : nullptr;
    if (type_utf8 == nullptr) PyErr_Clear();
    text = std::string(type_utf8 != nullptr ? type_utf8 : "?") + ": " + utf8;
    Py_XDECREF(type_name);
  }
  Py_DECREF(str);
  return text;
}

// Whether the raised `value` is, or wraps (DirectRunError.error), a
// KeyboardInterrupt.
bool IsInterrupt(PyObject* value) {
  if (value == nullptr) return false;
  if (PyErr_GivenExceptionMatches(value, PyExc_KeyboardInterrupt)) return true;
  PyObject* cause = PyObject_GetAttrString(value, "error");
  if (cause == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool interrupt =
      PyErr_GivenExceptionMatches(cause, PyExc_KeyboardInterrupt) != 0;
  Py_DECREF(cause);
  return interrupt;
}

// Takes the pending Python exception: its description, and whether it is an
// interrupt.
DirectOutcome TakeException(std::string* error) {
  PyObject* value = TakeRaised();
  if (value == nullptr) PyErr_Clear();
  *error = Describe(value);
  const bool interrupt = IsInterrupt(value);
  Py_XDECREF(value);
  return interrupt ? DirectOutcome::kInterrupted : DirectOutcome::kFailed;
}

PyObject* NewArray(const Column& column, void* data, int flags,
                   PyObject* base) {
  Py_INCREF(reinterpret_cast<PyObject*>(column.descr));  // stolen below
  PyObject* array = PyArray_NewFromDescr(
      &PyArray_Type, column.descr, static_cast<int>(column.dims.size()),
      const_cast<npy_intp*>(column.dims.data()), nullptr, data, flags,
      nullptr);
  if (array != nullptr && base != nullptr) {
    Py_INCREF(base);  // PyArray_SetBaseObject steals it
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), base) <
        0) {
      Py_DECREF(array);
      return nullptr;
    }
  }
  return array;
}

// A new array owning a copy of `bytes` at `data`, one element per byte for
// a sub-byte dtype.
PyObject* CopiedArray(const Column& column, const void* data) {
  if (column.unpack != nullptr) {
    npy_intp size = column.nbytes;
    PyObject* packed = PyArray_SimpleNew(1, &size, NPY_UINT8);
    if (packed == nullptr) return nullptr;
    if (size > 0) {
      std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(packed)), data,
                  column.nbytes);
    }
    PyObject* array = CallOne(column.unpack, packed);
    Py_DECREF(packed);
    return array;
  }
  PyObject* array = NewArray(column, nullptr, 0, nullptr);
  if (array != nullptr && column.nbytes > 0) {
    std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(array)), data,
                column.nbytes);
  }
  return array;
}

// The host function's arguments as a tuple (an `as_int` column's as a
// Python int); `views` gets a reference to each view of a device buffer
// (copy=False), to check after the run.
PyObject* Arguments(const Site& site, const DirectRequest& request,
                    std::vector<PyObject*>* views) {
  const size_t count = site.columns.size();
  PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(count));
  if (args == nullptr) return nullptr;
  int64_t total = 0;
  for (const Column& column : site.columns) total += AlignUp64(column.nbytes);
  PyObject* memory = nullptr;  // a large request's block, which it owns
  uint8_t* into = nullptr;     // where the next array goes in the block
  if (site.copy && total >= kLargePacket) {
    Block* block;
    try {
      block = Hub::Get().pool().Acquire(total);
    } catch (const std::bad_alloc&) {
      Py_DECREF(args);
      return PyErr_NoMemory();
    }
    into = block->data;
    memory = NewMemory(block->data, static_cast<Py_ssize_t>(total), block,
                       nullptr);
    if (memory == nullptr) {
      Py_DECREF(args);
      return nullptr;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const Column& column = site.columns[i];
    void* data = request.args[i].data;
    PyObject* array;
    if (column.as_int) {
      int32_t value;
      std::memcpy(&value, data, sizeof value);
      array = PyLong_FromLong(value);
    } else if (column.unpack != nullptr ||
               (site.copy && memory == nullptr)) {
      array = CopiedArray(column, data);
    } else if (memory != nullptr) {
      if (column.nbytes > 0) std::memcpy(into, data, column.nbytes);
      array = NewArray(column, into, NPY_ARRAY_CARRAY, memory);
      into += AlignUp64(column.nbytes);
    } else {
      array = NewArray(column, data, NPY_ARRAY_CARRAY_RO, nullptr);
      if (array != nullptr) {
        // An empty buffer may have no data: NumPy then allocated, writable.
        PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject*>(array),
                           NPY_ARRAY_WRITEABLE);
        Py_INCREF(array);
        views->push_back(array);
      }
    }
    if (array == nullptr) {
      Py_XDECREF(memory);
      Py_DECREF(args);
      return nullptr;
    }
    PyTuple_SetItem(args, static_cast<Py_ssize_t>(i), array);
  }
  Py_XDECREF(memory);  // the arrays hold it
  return args;
}

// A copy=False site's call is lent the device's result buffers: a tuple of
// writable uint8 arrays over them, which its consumer may fill in place
// (buffers=True with out=) and return, as views of them, for results.
// `views` gets a reference to each, to check after the run. Not for packed
// sub-byte results, which NumPy cannot view.
bool LendsOutputs(const Site& site, const DirectRequest& request) {
  return !site.copy && !site.pack_results && request.num_outputs > 0;
}

PyObject* Outputs(const DirectRequest& request, std::vector<PyObject*>* views) {
  const size_t count = request.num_outputs;
  PyObject* outputs = PyTuple_New(static_cast<Py_ssize_t>(count));
  if (outputs == nullptr) return nullptr;
  for (size_t i = 0; i < count; ++i) {
    npy_intp bytes = static_cast<npy_intp>(request.outputs[i].bytes);
    PyObject* view = PyArray_New(&PyArray_Type, 1, &bytes, NPY_UINT8, nullptr,
                                 request.outputs[i].data, 0, NPY_ARRAY_CARRAY,
                                 nullptr);
    if (view == nullptr) {
      Py_DECREF(outputs);
      return nullptr;
    }
    Py_INCREF(view);
    views->push_back(view);
    PyTuple_SetItem(outputs, static_cast<Py_ssize_t>(i), view);
  }
  return outputs;
}

// A GPU's buffer at `data`, as the factory makes it (`device_buffer(address,
// dtype, shape, gpu, stream, writable)`), with a reference in `views`, to
// check after the run.
PyObject* GpuBuffer(const DirectRequest& request, void* data,
                    PyArray_Descr* descr, const std::vector<npy_intp>& dims,
                    bool writable, std::vector<PyObject*>* views) {
  PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(dims.size()));
  for (size_t d = 0; shape != nullptr && d < dims.size(); ++d) {
    PyTuple_SetItem(shape, static_cast<Py_ssize_t>(d),
                    PyLong_FromLongLong(dims[d]));
  }
  PyObject* buffer =
      shape == nullptr
          ? nullptr
          : PyObject_CallFunction(
                device_buffer, "KONLKO",
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(data)),
                reinterpret_cast<PyObject*>(descr), shape,
                static_cast<long long>(request.gpu),
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(request.stream)),
                writable ? Py_True : Py_False);
  if (buffer != nullptr) {
    Py_INCREF(buffer);
    views->push_back(buffer);
  }
  return buffer;
}

// A GPU's buffers (request.gpu set): the arguments, read-only (`writable`
// false, shaped as the site's columns), or the result buffers, writable
// bytes, as a tuple.
PyObject* GpuBuffers(const Site& site, const DirectRequest& request,
                     bool writable, std::vector<PyObject*>* views) {
  const size_t count = writable ? request.num_outputs : request.num_args;
  PyObject* buffers = PyTuple_New(static_cast<Py_ssize_t>(count));
  PyArray_Descr* bytes = writable ? PyArray_DescrFromType(NPY_UINT8) : nullptr;
  for (size_t i = 0; buffers != nullptr && i < count; ++i) {
    PyObject* buffer =
        writable ? GpuBuffer(request, request.outputs[i].data, bytes,
                             {static_cast<npy_intp>(request.outputs[i].bytes)},
                             true, views)
                 : GpuBuffer(request, request.args[i].data,
                             site.columns[i].descr, site.columns[i].dims,
                             false, views);
    if (buffer == nullptr) {
      Py_CLEAR(buffers);
    } else {
      PyTuple_SetItem(buffers, static_cast<Py_ssize_t>(i), buffer);
    }
  }
  Py_XDECREF(reinterpret_cast<PyObject*>(bytes));
  return buffers;
}

// Whether a GPU's buffers can be handed over: a buffers=True site with no
// dtype packed below a byte (which DLPack cannot describe); else the
// request takes the copies' path.
bool TakesGpuBuffers(const Site& site) {
  if (!site.buffers || site.pack_results) return false;
  for (const Column& column : site.columns) {
    if (column.unpack != nullptr) return false;
  }
  return true;
}

// Writes the results into the device's buffers; false with `error` set when
// they do not fit.
bool WriteResults(const Site& site, PyObject* results,
                  const DirectRequest& request, std::string* error) {
  PyObject* sequence =
      PySequence_Fast(results, "host_callback: a call's results");
  if (sequence == nullptr) return false;
  const Py_ssize_t count = FastSize(sequence);
  std::vector<Py_buffer> buffers;
  buffers.reserve(static_cast<size_t>(count));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < count; ++i) {
    PyObject* item = FastItem(sequence, i);
    PyObject* wired = nullptr;
    if (site.pack_results) {
      wired = CallOne(wire, item);
      item = wired;
    }
    Py_buffer buffer;
    if (item == nullptr) {
      ok = false;
    } else if (PyObject_GetBuffer(item, &buffer, PyBUF_C_CONTIGUOUS) < 0) {
      PyErr_Clear();  // e.g. not contiguous: let `wire` make it so
      PyObject* contiguous = CallOne(wire, item);
      ok = contiguous != nullptr &&
           PyObject_GetBuffer(contiguous, &buffer, PyBUF_C_CONTIGUOUS) == 0;
      Py_XDECREF(contiguous);  // the buffer holds it
    }
    Py_XDECREF(wired);
    if (ok) buffers.push_back(buffer);
  }
  if (ok) {
    // A result that is its output buffer (filled in place) is not copied.
    bool same = static_cast<size_t>(count) == request.num_outputs;
    for (size_t i = 0; same && i < buffers.size(); ++i) {
      same = buffers[i].len == request.outputs[i].bytes;
    }
    if (!same) {
      *error = ResultSizesDiffer(
          buffers.size(),
          [&](size_t i) { return static_cast<int64_t>(buffers[i].len); },
          request.outputs, request.num_outputs);
      ok = false;
    } else {
      Py_BEGIN_ALLOW_THREADS
      for (size_t i = 0; i < buffers.size(); ++i) {
        if (buffers[i].len > 0 && buffers[i].buf != request.outputs[i].data) {
          std::memcpy(request.outputs[i].data, buffers[i].buf,
                      static_cast<size_t>(buffers[i].len));
        }
      }
      Py_END_ALLOW_THREADS
    }
  }
  for (Py_buffer& buffer : buffers) PyBuffer_Release(&buffer);
  Py_DECREF(sequence);
  if (!ok && error->empty()) TakeException(error);
  return ok;
}

// The results that are arrays over the lent output buffers (filled in
// place), each with a reference in `views`, to check after the run: one the
// host function kept gets a copy of its own data, as an argument's view.
void CollectFilled(PyObject* results, const DirectRequest& request,
                   std::vector<PyObject*>* views) {
  PyObject* sequence = PySequence_Fast(results, "");
  if (sequence == nullptr) {
    PyErr_Clear();
    return;
  }
  const Py_ssize_t count = FastSize(sequence);
  for (Py_ssize_t i = 0;
       i < count && static_cast<size_t>(i) < request.num_outputs; ++i) {
    PyObject* item = FastItem(sequence, i);
    if (PyArray_Check(item) &&
        PyArray_DATA(reinterpret_cast<PyArrayObject*>(item)) ==
            request.outputs[i].data) {
      Py_INCREF(item);
      views->push_back(item);
    }
  }
  Py_DECREF(sequence);
}

// Gives a view that the host function kept a private copy of its data, so
// that reading it later reads what it showed (the device's buffer may be
// freed or reused once the op returns). A GPU's buffer is released
// instead: it exports nothing more.
bool GiveOwnCopy(PyObject* view) {
  if (!PyArray_Check(view)) {
    PyObject* released = PyObject_CallMethod(view, "release", nullptr);
    Py_XDECREF(released);
    return released != nullptr;
  }
  auto* array = reinterpret_cast<PyArrayObject*>(view);
  PyObject* copy = PyArray_NewCopy(array, NPY_CORDER);
  if (copy == nullptr) return false;
  auto* fields = reinterpret_cast<PyArrayObject_fields*>(array);
  fields->data = PyArray_BYTES(reinterpret_cast<PyArrayObject*>(copy));
  PyObject* old_base = fields->base;
  fields->base = copy;
  Py_XDECREF(old_base);
  return true;
}

// Checks the views of device buffers once the run is over: one still
// referenced was kept by the host function (or something it made). It gets
// a copy of its data; `kept` tells whether any was.
void CheckViews(std::vector<PyObject*>* views, bool* kept) {
  *kept = false;
  for (PyObject* view : *views) {
    if (Py_REFCNT(view) > 1) {
      *kept = true;
      if (!GiveOwnCopy(view)) PyErr_Clear();
    }
    Py_DECREF(view);
  }
  views->clear();
}

// What a host function kept of what it was lent.
enum class Kept { kArgument, kOutput, kGpuBuffer };

// What a run fails with when its host function kept what it was lent.
std::string KeptMessage(const Site& site, Kept kept) {
  const char* name = site.name != nullptr ? Utf8(site.name) : "";
  if (name == nullptr) {
    PyErr_Clear();
    name = "";
  }
  if (kept == Kept::kGpuBuffer) {
    return std::string("host_callback: the host function ") + name +
           " kept a GPU buffer it got with buffers=True (an argument, out= "
           "or an array made from one through DLPack or "
           "__cuda_array_interface__: the device's memory, valid only until "
           "the function returns), so its computation fails. Keep a copy "
           "instead, e.g. cupy.array(a)";
  }
  if (kept == Kept::kOutput) {
    return std::string("host_callback: the host function ") + name +
           " kept a buffer of out= it got with buffers=True (a view of the "
           "device's result buffer, valid only until the function returns), "
           "so its computation fails. Keep a copy instead, e.g. "
           "np.array(out)";
  }
  return std::string("host_callback: the host function ") + name +
         " kept an argument it got with copy=False (a read-only view of the "
         "device's buffer, valid only until the function returns), so its "
         "computation fails. Keep a copy instead, e.g. np.array(a), or drop "
         "copy=False";
}

// `runner(entry, device_id, args[, outputs[, stream]])`: the stream only
// for a GPU's buffers. Null with the exception set.
PyObject* CallRunner(const Site& site, const DirectRequest& request,
                     PyObject* args, PyObject* outputs) {
  PyObject* device_id = PyLong_FromLongLong(request.device_id);
  PyObject* stream =
      request.gpu < 0
          ? nullptr
          : PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(
                reinterpret_cast<uintptr_t>(request.stream)));
  PyObject* results =
      device_id == nullptr || (request.gpu >= 0 && stream == nullptr)
          ? nullptr
          : PyObject_CallFunctionObjArgs(runner, site.entry, device_id, args,
                                         outputs, stream,
                                         nullptr);  // may end early
  Py_XDECREF(device_id);
  Py_XDECREF(stream);
  return results;
}

// A plain request's consumer (a tap's, or a call's with no lent buffers),
// called here, which costs less than the runner's Python frame: what the
// runner does, counted in own_runs, and an exception goes through
// `failed(entry, error)`, which raises what the runner would. A consumer
// no longer registered goes to the runner, which raises the error.
PyObject* CallConsumer(const Site& site, const DirectRequest& request,
                       PyObject* args) {
  PyObject* consumer = PyDict_GetItemWithError(consumers, site.entry);
  if (consumer == nullptr) {
    return PyErr_Occurred() ? nullptr
                            : CallRunner(site, request, args, nullptr);
  }
  PyObject* device_id = PyLong_FromLongLong(request.device_id);
  if (device_id == nullptr) return nullptr;
  // Held for the run: the consumer is borrowed from the dict, which the run
  // may change, and StopCallingConsumers may drop `failed` meanwhile.
  PyObject* on_failure = failed;
  Py_INCREF(consumer);
  Py_INCREF(on_failure);
  OwnRuns& runs = own_runs[request.device_id];
  ++runs.running;
  PyObject* results =
      PyObject_CallFunctionObjArgs(consumer, args, device_id, nullptr);
  --runs.running;
  ++runs.ran;
  Py_DECREF(consumer);
  Py_DECREF(device_id);
  PyObject* value = results == nullptr ? TakeRaised() : nullptr;
  if (value != nullptr) {
    PyObject* none = PyObject_CallFunctionObjArgs(on_failure, site.entry,
                                                  value, nullptr);  // raises
    if (none != nullptr) {
      Py_DECREF(none);
      PyErr_SetString(PyExc_RuntimeError,
                      "host_callback: a host function failed");
    }
    Py_DECREF(value);
  }
  Py_DECREF(on_failure);
  return results;
}

DirectOutcome RunWithGil(const DirectRequest& request, std::string* error) {
  if (runner == nullptr) return DirectOutcome::kDeclined;
  std::shared_ptr<const Site> site = FindSite(request.site);
  if (site == nullptr) return DirectOutcome::kDeclined;
  if (site->columns.size() != request.num_args) return DirectOutcome::kDeclined;
  for (size_t i = 0; i < request.num_args; ++i) {
    if (site->columns[i].nbytes != request.args[i].bytes) {
      return DirectOutcome::kDeclined;  // the queue's decoder reports it
    }
  }
  const bool gpu = request.gpu >= 0;
  if (gpu && (device_buffer == nullptr || !TakesGpuBuffers(*site))) {
    return DirectOutcome::kDeclined;  // copied through host memory instead
  }
  // A Ctrl-C that arrived while the device ran belongs to this computation.
  if (PyErr_CheckSignals() < 0) return TakeException(error);
  std::vector<PyObject*> views, output_views, filled;
  const bool lends = gpu || LendsOutputs(*site, request);
  PyObject* args = gpu ? GpuBuffers(*site, request, false, &views)
                       : Arguments(*site, request, &views);
  PyObject* outputs =
      args == nullptr || !lends ? nullptr
      : gpu                     ? GpuBuffers(*site, request, true, &output_views)
                                : Outputs(request, &output_views);
  if (args == nullptr || (outputs == nullptr && lends)) {
    Py_XDECREF(args);
    bool kept;
    CheckViews(&views, &kept);
    CheckViews(&output_views, &kept);
    return TakeException(error);
  }
  ++runner_calls_here;
  PyObject* results = consumers != nullptr && !lends
                          ? CallConsumer(*site, request, args)
                          : CallRunner(*site, request, args, outputs);
  --runner_calls_here;
  Py_DECREF(args);
  Py_XDECREF(outputs);
  DirectOutcome outcome = DirectOutcome::kDone;
  if (results == nullptr) {
    outcome = TakeException(error);  // drops the traceback, and its frames
  } else {
    // A tap's results (none) are not looked at; a GPU run's consumer wrote
    // them into the lent buffers, on the stream.
    if (request.num_outputs > 0 && !gpu &&
        !WriteResults(*site, results, request, error)) {
      outcome = DirectOutcome::kFailed;
    }
    if (outputs != nullptr && !gpu) CollectFilled(results, request, &filled);
    Py_DECREF(results);
  }
  // The filled results first: a kept one's own copy releases its lent bytes.
  bool kept, kept_filled, kept_output;
  CheckViews(&views, &kept);
  CheckViews(&filled, &kept_filled);
  CheckViews(&output_views, &kept_output);
  if ((kept || kept_filled || kept_output) &&
      outcome == DirectOutcome::kDone) {
    *error = KeptMessage(*site, gpu    ? Kept::kGpuBuffer
                                : kept ? Kept::kArgument
                                       : Kept::kOutput);
    outcome = DirectOutcome::kFailed;
  }
  return outcome;
}

}  // namespace

void SetRunner(PyObject* new_runner, PyObject* new_wire,
               PyObject* new_device_buffer, PyObject* new_consumers,
               PyObject* new_failed) {
  if (new_consumers == nullptr || new_failed == nullptr) {
    new_consumers = new_failed = nullptr;
  }
  for (PyObject* object : {new_runner, new_wire, new_device_buffer,
                           new_consumers, new_failed}) {
    Py_XINCREF(object);
  }
  Replace(&runner, new_runner);
  Replace(&wire, new_wire);
  Replace(&device_buffer, new_device_buffer);
  Replace(&consumers, new_consumers);
  Replace(&failed, new_failed);
}

void StopCallingConsumers() {
  Replace(&consumers, nullptr);
  Replace(&failed, nullptr);  // a run that holds it keeps its own reference
}

std::unordered_map<int64_t, OwnRuns> OwnRunsNow() { return own_runs; }

bool RunsHostFunctionHere() { return runner_calls_here > 0; }

DirectOutcome Run(const DirectRequest& request, std::string* error) {
  PyGILState_STATE gil = PyGILState_Ensure();
  DirectOutcome outcome = RunWithGil(request, error);
  PyGILState_Release(gil);
  return outcome;
}

}  // namespace hcb::python
