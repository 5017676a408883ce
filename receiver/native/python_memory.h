// `Memory`: a Python object that exposes memory host_callback lends to a
// host function (the buffer protocol, so NumPy arrays can view it), and
// frees it when the last array viewing it is gone: a block goes back to its
// pool (block_pool.h), another owner (`keep`) is released.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_MEMORY_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_MEMORY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "block_pool.h"

namespace hcb::python {

// The type, a heap type made by ReadyMemoryType (null before).
extern PyTypeObject* MemoryType;

// A new Memory over `nbytes` at `data`. It owns `block` (returned to the
// pool at its end) when not null, and holds a reference to `keep` when not
// null. Returns a new reference, or null with a Python exception set.
PyObject* NewMemory(void* data, Py_ssize_t nbytes, Block* block,
                    PyObject* keep);

// Makes the type; false with a Python exception set on failure.
bool ReadyMemoryType();

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_MEMORY_H_
