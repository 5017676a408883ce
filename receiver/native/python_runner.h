// The direct path: a request (a `call`, or a tap in the synchronous mode)
// whose device queue is idle runs its host function on the device thread.
// The runner takes the GIL, builds the NumPy arguments itself (copies, or
// read-only views of the device's buffers for a site registered with
// copy=False), calls Python once, and writes the results straight into the
// device's result buffers.
//
// The site table below is Python's: it is read and written with the GIL
// held, which guards it.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hub.h"

namespace hcb::python {

// `runner(entry, device_id, args)` runs a site's host function (`entry` is
// what the site was registered with, `args` a tuple of arrays) and returns
// its results (None for none) or raises; `wire(array)` returns a result as
// the device stores it (C-contiguous, sub-byte dtypes packed). Both null:
// no direct runs. Needs the GIL.
void SetRunner(PyObject* runner, PyObject* wire);

// Records how to build the arguments of `site`'s packets: for each array its
// size in bytes as the device stores it, a NumPy dtype, a shape and, for a
// packed sub-byte dtype, a function that unpacks a uint8 array of its bytes. `copy` false: views of the device's
// buffers, valid until the host function returns. `pack_results`: the
// results go through `wire`. Needs the GIL; false with a Python exception
// set on a bad argument.
bool RegisterSite(int64_t site, const std::vector<int64_t>& sizes,
                  PyObject* entry, PyObject* name, PyObject* dtypes,
                  PyObject* shapes, PyObject* unpackers, bool copy,
                  bool pack_results);
// Needs the GIL.
void UnregisterSite(int64_t site);

// The hub's DirectRunner; takes the GIL.
DirectOutcome Run(const DirectRequest& request, std::string* error);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
