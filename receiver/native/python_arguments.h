// The NumPy arguments of a direct run (python_runner.h), built from the
// device's buffers with the GIL: copies (a large request's in one pooled
// block, viewed through a Memory), read-only views of the device's buffers
// for a copy=False site, a site's `as_int` columns as Python ints, the
// result buffers lent to a copy=False call, and a GPU's buffers made by
// the runner's `device_buffer` factory; a site's copies are refilled for the
// next run where nothing kept them. Each view of a device buffer is
// also put in `views`, for python_results.h:CheckViews after the run.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_ARGUMENTS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_ARGUMENTS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "direct_runs.h"
#include "python_sites.h"

namespace hcb::python {

// The arguments of the packet at `packet` (its header first), written to
// `site` with no column packed below a byte: a tuple of views of its
// bytes, read-only where `read_only`, that hold `base` (which owns them),
// and an `as_int` column's Python int; null with the exception set.
PyObject* PacketArguments(const Site& site, uint8_t* packet, bool read_only,
                          PyObject* base);

// The host function's arguments as a tuple; null with the exception set.
// The tuple that the site's last run returned (ReturnArguments), refilled,
// where there is one.
PyObject* TakeArguments(const Site& site, const DirectRequest& request,
                        std::vector<PyObject*>* views);

// After the run: `arguments` (a reference, taken) become the site's spare,
// to be refilled by the next run, where nothing else holds them or their
// arrays and each array is as it was made (copies of a size that is not
// pooled: no view, nothing unpacked); else they are dropped. So a
// host function that keeps its array, or a view of it, keeps its own data.
void ReturnArguments(const Site& site, PyObject* arguments);

// Whether a copy=False site's call is lent the device's result buffers.
bool LendsOutputs(const Site& site, const DirectRequest& request);

// The lent result buffers: a tuple of writable uint8 arrays over them.
PyObject* Outputs(const DirectRequest& request, std::vector<PyObject*>* views);

// A GPU's buffers (request.gpu set), made by `factory` (python_runner.h's
// `device_buffer`): the arguments, read-only, or with `writable` the
// result buffers, as a tuple.
PyObject* GpuBuffers(PyObject* factory, const Site& site,
                     const DirectRequest& request, bool writable,
                     std::vector<PyObject*>* views);

// Whether a GPU's buffers can be handed over for `site`.
bool TakesGpuBuffers(const Site& site);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_ARGUMENTS_H_
