// What the extension module's parts share: see module_support.h.

#include "module_support.h"

#include "python_limited.h"

namespace hcb::python {

bool Int64s(PyObject* list, std::vector<int64_t>* out) {
  PyObject* sequence = PySequence_Fast(list, "expected a sequence of ints");
  if (sequence == nullptr) return false;
  const Py_ssize_t count = FastSize(sequence);
  out->resize(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    (*out)[static_cast<size_t>(i)] = PyLong_AsLongLong(FastItem(sequence, i));
  }
  Py_DECREF(sequence);
  return !PyErr_Occurred();
}

bool SpanList(PyObject* list, std::vector<Span>* out) {
  PyObject* sequence = PySequence_Fast(list, "expected (address, bytes) pairs");
  if (sequence == nullptr) return false;
  const Py_ssize_t count = FastSize(sequence);
  out->resize(static_cast<size_t>(count));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < count; ++i) {
    unsigned long long address;
    long long bytes;
    ok = PyArg_ParseTuple(FastItem(sequence, i), "KL", &address, &bytes) != 0;
    (*out)[static_cast<size_t>(i)] = {reinterpret_cast<void*>(address),
                                      static_cast<int64_t>(bytes)};
  }
  Py_DECREF(sequence);
  return ok;
}

PyObject* NoneOrRaise(const Status& status) {
  if (status.ok()) Py_RETURN_NONE;
  PyErr_SetString(PyExc_RuntimeError, status.message.c_str());
  return nullptr;
}

PyObject* Capsule(XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*)) {
  return PyCapsule_New(reinterpret_cast<void*>(handler), nullptr, nullptr);
}

}  // namespace hcb::python
