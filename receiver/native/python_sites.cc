// The sites that direct runs serve: see python_sites.h.

// Before any header that includes NumPy's (python_sites.h does): NumPy
// declares this file's table of its C API at its first header, and an
// unnamed one is this file's own, never imported.
#define PY_ARRAY_UNIQUE_SYMBOL hcb_ARRAY_API
#define NO_IMPORT_ARRAY
#include "python_sites.h"

#include <numpy/arrayobject.h>

#include <unordered_map>
#include <utility>

namespace hcb::python {
namespace {

std::unordered_map<int64_t, std::shared_ptr<Site>>* sites =
    new std::unordered_map<int64_t, std::shared_ptr<Site>>();

}  // namespace

bool RegisterSite(int64_t site_id, const std::vector<int64_t>& sizes,
                  PyObject* entry, PyObject* name, PyObject* dtypes,
                  PyObject* shapes, PyObject* unpackers, PyObject* ints,
                  bool copy, bool pack_results, bool buffers) {
  auto site = std::make_shared<Site>();
  Py_INCREF(entry);
  site->entry = entry;
  Py_INCREF(name);
  site->name = name;
  site->copy = copy;
  site->pack_results = pack_results;
  site->buffers = buffers;
  const Py_ssize_t count = PySequence_Size(dtypes);
  if (count < 0 || PySequence_Size(shapes) != count ||
      PySequence_Size(unpackers) != count || PySequence_Size(ints) != count ||
      static_cast<size_t>(count) != sizes.size()) {
    PyErr_SetString(PyExc_ValueError,
                    "register_site: sizes, dtypes, shapes, unpackers and ints "
                    "differ in length");
    return false;
  }
  site->columns.resize(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    Column& column = site->columns[static_cast<size_t>(i)];
    PyObject* dtype = PySequence_GetItem(dtypes, i);
    PyObject* shape = PySequence_GetItem(shapes, i);
    PyObject* unpack = PySequence_GetItem(unpackers, i);
    PyObject* as_int = PySequence_GetItem(ints, i);
    bool ok = dtype != nullptr && shape != nullptr && unpack != nullptr &&
              as_int != nullptr &&
              PyArray_DescrConverter(dtype, &column.descr) == NPY_SUCCEED;
    column.nbytes = sizes[static_cast<size_t>(i)];
    const Py_ssize_t ndim = ok ? PySequence_Size(shape) : -1;
    ok = ok && ndim >= 0;
    const int is_int = ok ? PyObject_IsTrue(as_int) : 0;
    ok = ok && is_int >= 0;
    if (ok && is_int == 1) {
      column.as_int = true;  // only an int32 scalar
      PyArray_Descr* int32 = PyArray_DescrFromType(NPY_INT32);
      ok = ndim == 0 && column.nbytes == sizeof(int32_t) &&
           PyArray_EquivTypes(column.descr, int32);
      Py_DECREF(reinterpret_cast<PyObject*>(int32));
      if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "register_site: only an int32 scalar comes as an int");
      }
    }
    for (Py_ssize_t d = 0; ok && d < ndim; ++d) {
      PyObject* extent = PySequence_GetItem(shape, d);
      const long long value =
          extent == nullptr ? -1 : PyLong_AsLongLong(extent);
      Py_XDECREF(extent);
      ok = value >= 0 && !PyErr_Occurred();
      column.dims.push_back(static_cast<npy_intp>(value));
    }
    if (ok && unpack != Py_None) {
      Py_INCREF(unpack);
      column.unpack = unpack;
    }
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(unpack);
    Py_XDECREF(as_int);
    if (!ok) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "register_site: a bad shape");
      }
      return false;
    }
  }
  (*sites)[site_id] = std::move(site);
  return true;
}

void UnregisterSite(int64_t site_id) {
  auto it = sites->find(site_id);
  if (it == sites->end()) return;
  std::shared_ptr<Site> site = std::move(it->second);
  sites->erase(it);
  // `site` dies here (or after the run that holds it), with the GIL held.
}

std::shared_ptr<const Site> FindSite(int64_t site_id) {
  auto it = sites->find(site_id);
  if (it == sites->end()) return nullptr;
  return it->second;
}

}  // namespace hcb::python
