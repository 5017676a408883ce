// A plain tap's consumer in C: `consumer(arrays, device_id)` calls
// `func(arrays[0], transforms)`, as host_callback/host/host_functions.py's
// Python consumer of a tap of one array with no device or shard argument
// does, and on an exception calls `failed(device_id)` before it goes on.
// The runner and the receiver thread's C loop call `func` straight from C
// (RunConsumer), with no Python frame between.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_PLAIN_TAP_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_PLAIN_TAP_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hcb::python {

// `consumer(arrays, device_id)`, a PlainTap's without the tuple of a call:
// the result (a new reference), or null with the exception set.
PyObject* RunConsumer(PyObject* consumer, PyObject* arrays,
                      PyObject* device_id);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_PLAIN_TAP_H_
