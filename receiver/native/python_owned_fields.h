// The garbage collector's functions of a heap type made with
// PyType_FromSpec whose objects own `kCount` references that lie in a row,
// the first at `FieldsOf(object)`: traverse, clear, and a dealloc that
// clears them and drops the object's reference to its type (the type's
// Py_tp_traverse, Py_tp_clear and Py_tp_dealloc slots); and New.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_OWNED_FIELDS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_OWNED_FIELDS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hcb::python {

template <typename Object, int kCount, PyObject** (*FieldsOf)(Object*)>
struct OwnedFields {
  static int Traverse(PyObject* self, visitproc visit, void* arg) {
    PyObject** fields = FieldsOf(reinterpret_cast<Object*>(self));
    for (int i = 0; i < kCount; ++i) Py_VISIT(fields[i]);
    Py_VISIT(reinterpret_cast<PyObject*>(Py_TYPE(self)));
    return 0;
  }

  static int Clear(PyObject* self) {
    PyObject** fields = FieldsOf(reinterpret_cast<Object*>(self));
    for (int i = 0; i < kCount; ++i) Py_CLEAR(fields[i]);
    return 0;
  }

  static void Dealloc(PyObject* self) {
    PyTypeObject* type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Clear(self);
    reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(self);
    Py_DECREF(reinterpret_cast<PyObject*>(type));
  }

  // A new object of `type` that owns a reference to each of `values`.
  static Object* New(PyTypeObject* type, PyObject* const (&values)[kCount]) {
    auto* object = reinterpret_cast<Object*>(PyType_GenericAlloc(type, 0));
    if (object == nullptr) return nullptr;
    PyObject** fields = FieldsOf(object);
    for (int i = 0; i < kCount; ++i) {
      Py_INCREF(values[i]);
      fields[i] = values[i];
    }
    return object;
  }
};

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_OWNED_FIELDS_H_
