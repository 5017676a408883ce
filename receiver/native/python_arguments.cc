// A direct run's arguments: see python_arguments.h.

// NumPy's C API table is the module's (python_sites.h): defined before any
// header that includes NumPy's.
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION

#include "python_arguments.h"

#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "hub.h"
#include "python_memory.h"
#include "python_limited.h"

namespace hcb::python {
namespace {

// Arguments of a large request are copied into one block of the hub's pool
// (memory already touched: no page faults), as large packets are.
constexpr int64_t kAlignBytes = 64;

int64_t AlignUp64(int64_t n) {
  return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
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

// A GPU's buffer at `data`, as `factory(address, dtype, shape, gpu, stream,
// writable)` makes it, with a reference in `views`, to check after the run.
PyObject* GpuBuffer(PyObject* factory, const DirectRequest& request,
                    void* data, PyArray_Descr* descr,
                    const std::vector<npy_intp>& dims, bool writable,
                    std::vector<PyObject*>* views) {
  PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(dims.size()));
  for (size_t d = 0; shape != nullptr && d < dims.size(); ++d) {
    PyTuple_SetItem(shape, static_cast<Py_ssize_t>(d),
                    PyLong_FromLongLong(dims[d]));
  }
  PyObject* buffer =
      shape == nullptr
          ? nullptr
          : PyObject_CallFunction(
                factory, "KONLKO",
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

// An `as_int` column's argument: the int32 at `data`, as a Python int.
PyObject* IntArgument(const void* data) {
  int32_t value;
  std::memcpy(&value, data, sizeof value);
  return PyLong_FromLong(value);
}

// Whether `array`, the argument of `column`, may be refilled for the next
// run: an int (replaced), or an array that nothing else holds (not even a
// weak reference) and that is still the copy it was made (its dtype, shape
// and flags: a host function may set them in place), owning its data.
bool Refillable(const Column& column, PyObject* array) {
  if (column.as_int) return true;  // an int, replaced by the next run's
  if (column.unpack != nullptr || Py_REFCNT(array) != 1 ||
      !PyArray_CheckExact(array)) {
    return false;
  }
  auto* fields = reinterpret_cast<PyArrayObject_fields*>(array);
  auto* made = reinterpret_cast<PyArrayObject*>(array);
  constexpr int kMade = NPY_ARRAY_CARRAY | NPY_ARRAY_OWNDATA;
  if (PyArray_DESCR(made) != column.descr || fields->weakreflist != nullptr ||
      PyArray_BASE(made) != nullptr || (PyArray_FLAGS(made) & kMade) != kMade ||
      PyArray_NDIM(made) != static_cast<int>(column.dims.size())) {
    return false;
  }
  return std::equal(column.dims.begin(), column.dims.end(),
                    PyArray_DIMS(made));
}

// The host function's arguments as a tuple (an `as_int` column's as a
// Python int); `views` gets a reference to each view of a device buffer
// (copy=False), to check after the run.
PyObject* NewArguments(const Site& site, const DirectRequest& request,
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
      array = IntArgument(data);
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

}  // namespace

PyObject* PacketArguments(const Site& site, uint8_t* packet, bool read_only,
                          PyObject* base) {
  const size_t count = site.columns.size();
  PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(count));
  int64_t offset = kHeaderBytes;
  for (size_t i = 0; args != nullptr && i < count; ++i) {
    const Column& column = site.columns[i];
    PyObject* array =
        column.as_int
            ? IntArgument(packet + offset)
            : NewArray(column, packet + offset,
                       read_only ? NPY_ARRAY_CARRAY_RO : NPY_ARRAY_CARRAY,
                       base);
    if (array == nullptr) {
      Py_CLEAR(args);
    } else {
      PyTuple_SetItem(args, static_cast<Py_ssize_t>(i), array);
    }
    offset += AlignUp(column.nbytes);
  }
  return args;
}

PyObject* TakeArguments(const Site& site, const DirectRequest& request,
                        std::vector<PyObject*>* views) {
  PyObject* args = site.spare_arguments;
  if (args == nullptr) return NewArguments(site, request, views);
  site.spare_arguments = nullptr;  // a nested run of the site makes its own
  for (size_t i = 0; i < site.columns.size(); ++i) {
    const Py_ssize_t item = static_cast<Py_ssize_t>(i);
    if (site.columns[i].as_int) {
      PyObject* value = IntArgument(request.args[i].data);
      if (value == nullptr || PyTuple_SetItem(args, item, value) < 0) {
        Py_DECREF(args);
        return nullptr;
      }
      continue;
    }
    auto* array = reinterpret_cast<PyArrayObject*>(PyTuple_GetItem(args, item));
    std::memcpy(PyArray_DATA(array), request.args[i].data,
                site.columns[i].nbytes);
  }
  return args;
}

void ReturnArguments(const Site& site, PyObject* arguments) {
  bool refillable = site.copy && site.spare_arguments == nullptr &&
                    Py_REFCNT(arguments) == 1;
  for (size_t i = 0; refillable && i < site.columns.size(); ++i) {
    refillable = Refillable(
        site.columns[i],
        PyTuple_GetItem(arguments, static_cast<Py_ssize_t>(i)));
  }
  if (refillable) {
    site.spare_arguments = arguments;
  } else {
    Py_DECREF(arguments);
  }
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

// A GPU's buffers (request.gpu set): the arguments, read-only (`writable`
// false, shaped as the site's columns), or the result buffers, writable
// bytes, as a tuple.
PyObject* GpuBuffers(PyObject* factory, const Site& site,
                     const DirectRequest& request, bool writable,
                     std::vector<PyObject*>* views) {
  const size_t count = writable ? request.num_outputs : request.num_args;
  PyObject* buffers = PyTuple_New(static_cast<Py_ssize_t>(count));
  PyArray_Descr* bytes = writable ? PyArray_DescrFromType(NPY_UINT8) : nullptr;
  for (size_t i = 0; buffers != nullptr && i < count; ++i) {
    PyObject* buffer =
        writable ? GpuBuffer(factory, request, request.outputs[i].data, bytes,
                             {static_cast<npy_intp>(request.outputs[i].bytes)},
                             true, views)
                 : GpuBuffer(factory, request, request.args[i].data,
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

}  // namespace hcb::python
