// A direct run's outcome: see python_results.h.

// NumPy's C API table is the module's (python_sites.h): defined before any
// header that includes NumPy's.
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION

#include "python_results.h"

#include <numpy/arrayobject.h>

#include <cstring>

#include "calls.h"
#include "python_limited.h"

namespace hcb::python {
namespace {

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

}  // namespace

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

// Writes the results into the device's buffers; false with `error` set when
// they do not fit.
bool WriteResults(PyObject* wire, const Site& site, PyObject* results,
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

}  // namespace hcb::python
