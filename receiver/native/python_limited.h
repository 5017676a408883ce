// What CPython's limited API of Python 3.11 (the stable ABI that the module
// is built for, see setup.py) leaves out as macros or newer functions, made
// of functions it has.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_LIMITED_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_LIMITED_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hcb::python {

// PySequence_Fast_GET_SIZE, of the list or tuple PySequence_Fast made.
inline Py_ssize_t FastSize(PyObject* fast) {
  return PyList_Check(fast) ? PyList_Size(fast) : PyTuple_Size(fast);
}

// PySequence_Fast_GET_ITEM: a borrowed reference.
inline PyObject* FastItem(PyObject* fast, Py_ssize_t i) {
  return PyList_Check(fast) ? PyList_GetItem(fast, i)
                            : PyTuple_GetItem(fast, i);
}

// Py_XSETREF: `*slot` takes `value`'s reference and drops its old one.
inline void Replace(PyObject** slot, PyObject* value) {
  PyObject* old = *slot;
  *slot = value;
  Py_XDECREF(old);
}

// PyObject_CallOneArg.
inline PyObject* CallOne(PyObject* callable, PyObject* arg) {
  return PyObject_CallFunctionObjArgs(callable, arg, nullptr);
}

// PyErr_GetRaisedException (3.12): takes the pending exception, normalized,
// with its traceback set on it; a new reference. Null where no exception
// object could be made, which leaves the exception pending.
inline PyObject* TakeRaised() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value == nullptr) {
    PyErr_Restore(type, value, traceback);
    return nullptr;
  }
  if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
}

// PyUnicode_AsUTF8: the string's UTF-8, or null with an exception set.
inline const char* Utf8(PyObject* str) {
  return PyUnicode_AsUTF8AndSize(str, nullptr);
}

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_LIMITED_H_
