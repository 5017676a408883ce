// Instances of a Python class with __slots__, made in C: see
// python_instances.cc (new_instance and instance_feed).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_INSTANCES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_INSTANCES_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>

namespace hcb::python {

// new_instance(type, *values): a new instance of `type` whose slots, in the
// order of its __slots__, are set to the `count` `values`, without its
// __init__; null with the exception set. Needs the GIL.
PyObject* NewSlotsInstance(PyTypeObject* type, PyObject* const* values,
                           size_t count);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_INSTANCES_H_
