// The sites that direct runs serve: for each callback site, how to build
// its host function's NumPy arguments (a dtype, a shape and a byte size per
// array, an unpacker for a packed sub-byte dtype, copy or view) and how to
// hand back its results. Registered by the module's register_site
// (receiver/native_sites.py:register_site) beside the site's array sizes
// (site_sizes.h); read by the direct runner (python_runner.cc).
//
// A copy of the site table that receiver/native_sites.py owns (it lays the
// arrays out), written beside SiteSizes by the same module call;
// tests/test_native_sites.py checks it against the owner. It is read and
// written with the GIL held, which guards it. A run holds its site by shared_ptr: the host function may
// register or free sites (it may compile JAX code) while it runs.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_SITES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_SITES_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef NPY_NO_DEPRECATED_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#endif
// A source that includes this header defines PY_ARRAY_UNIQUE_SYMBOL (and
// NO_IMPORT_ARRAY) first: NumPy's headers declare the C API table here.
#include <numpy/ndarraytypes.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace hcb::python {

// One array of a site's packets.
struct Column {
  PyArray_Descr* descr = nullptr;  // owned reference
  std::vector<npy_intp> dims;
  int64_t nbytes = 0;              // as the device stores it (packed)
  PyObject* unpack = nullptr;      // owned reference, for a sub-byte dtype
  bool as_int = false;             // an int32 scalar, given as a Python int
};

struct Site {
  PyObject* entry = nullptr;       // owned reference
  PyObject* name = nullptr;        // owned reference: the host function's
  std::vector<Column> columns;
  bool copy = true;
  bool pack_results = false;
  bool buffers = false;  // on a GPU: runs on the device's buffers
  // A run's arguments that the next run may refill (python_arguments.h:
  // TakeArguments): an owned reference or null, guarded by the GIL.
  mutable PyObject* spare_arguments = nullptr;

  Site() = default;
  Site(const Site&) = delete;
  Site& operator=(const Site&) = delete;
  ~Site() {
    Py_XDECREF(spare_arguments);
    Py_XDECREF(entry);
    Py_XDECREF(name);
    for (Column& column : columns) {
      Py_XDECREF(reinterpret_cast<PyObject*>(column.descr));
      Py_XDECREF(column.unpack);
    }
  }
};

// Records how to build the arguments of `site`'s packets: for each array
// its size in bytes as the device stores it, a NumPy dtype, a shape and,
// for a packed sub-byte dtype, a function that unpacks a uint8 array of its
// bytes; `ints` (a bool per array) marks the int32 scalars that the host
// function gets as Python ints (`int_columns`). `copy` false: views of
// the device's buffers, valid until the host function returns.
// `pack_results`: the results go through the runner's `wire`. `buffers`: a
// GPU's direct run hands the host function its device buffers
// (python_runner.h). Needs the GIL; false with a Python exception set on a
// bad argument.
bool RegisterSite(int64_t site, const std::vector<int64_t>& sizes,
                  PyObject* entry, PyObject* name, PyObject* dtypes,
                  PyObject* shapes, PyObject* unpackers, PyObject* ints,
                  bool copy, bool pack_results, bool buffers);
// Needs the GIL.
void UnregisterSite(int64_t site);
// The site, or null when it is not registered. Needs the GIL.
std::shared_ptr<const Site> FindSite(int64_t site);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_SITES_H_
