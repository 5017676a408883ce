// What a direct run (python_runner.h) makes of its host function's
// outcome, with the GIL: an exception as the device reports it (and
// whether it is Ctrl-C's), the results written into the device's buffers,
// and the check that the host function kept none of the buffers it was
// lent (a kept one gets its own copy of its data, and the run fails).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RESULTS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RESULTS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>
#include <vector>

#include "direct_runs.h"
#include "python_sites.h"

namespace hcb::python {

// Takes the pending Python exception: its description, and whether it is
// an interrupt (kInterrupted) or a failure (kFailed).
DirectOutcome TakeException(std::string* error);

// Writes the results into the device's buffers, each through `wire`
// (python_runner.h) where it is packed or not contiguous; false with
// `error` set when they do not fit.
bool WriteResults(PyObject* wire, const Site& site, PyObject* results,
                  const DirectRequest& request, std::string* error);

// The results that are arrays over the lent output buffers, each with a
// reference in `views`.
void CollectFilled(PyObject* results, const DirectRequest& request,
                   std::vector<PyObject*>* views);

// Checks the views once the run is over: one still referenced was kept by
// the host function and gets its own copy; `kept` tells whether any was.
void CheckViews(std::vector<PyObject*>* views, bool* kept);

// What a host function kept of what it was lent.
enum class Kept { kArgument, kOutput, kGpuBuffer };

// What a run fails with when its host function kept what it was lent.
std::string KeptMessage(const Site& site, Kept kept);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RESULTS_H_
