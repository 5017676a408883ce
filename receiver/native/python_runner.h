// The direct path: a request (a `call`, or a tap in the synchronous mode)
// whose device queue is idle runs its host function on the device thread.
// The runner takes the GIL, builds the NumPy arguments itself (copies, or
// read-only views of the device's buffers for a site registered with
// copy=False), calls Python once, and writes the results straight into the
// device's result buffers. A copy=False site's call is also lent those
// result buffers, as writable bytes, which its consumer may fill in place
// (buffers=True with out=) and return: a result that is its output buffer
// is not copied, so no copy either way.
//
// The runner is called on the device's thread by DirectRuns::TryRun
// (direct_runs.h); it takes the GIL, which guards its Python objects and
// the sites it serves (python_sites.h).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>

#include "direct_runs.h"

namespace hcb::python {

// `runner(entry, device_id, args[, outputs])` runs a site's host function
// (`entry` is what the site was registered with, `args` a tuple of arrays,
// `outputs` the lent result buffers) and returns its results (None for
// none; views of `outputs` that it filled count as written) or raises; `wire(array)` returns a result as
// the device stores it (C-contiguous, sub-byte dtypes packed). Both null:
// no direct runs. Needs the GIL.
void SetRunner(PyObject* runner, PyObject* wire);

// The DirectRunner (direct_runs.h); takes the GIL.
DirectOutcome Run(const DirectRequest& request, std::string* error);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
