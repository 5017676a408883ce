// Plain taps' consumers: see python_plain_tap.h.

#include "python_plain_tap.h"

#include "module_support.h"
#include "python_limited.h"
#include "python_owned_fields.h"

namespace hcb::python {
namespace {

struct PlainTap {
  PyObject_HEAD
  // Owned references, in this order (Fields).
  PyObject* func;
  PyObject* transforms;
  PyObject* failed;  // failed(device_id)
};

constexpr int kPlainTapFields = 3;

PyObject** Fields(PlainTap* tap) { return &tap->func; }

PyTypeObject* PlainTapType = nullptr;

// `func(arrays[0], transforms)`; on an exception, `failed(device_id)` first.
PyObject* Run(PlainTap* tap, PyObject* arrays, PyObject* device_id) {
  PyObject* arg = PySequence_GetItem(arrays, 0);
  if (arg == nullptr) return nullptr;
  PyObject* result =
      PyObject_CallFunctionObjArgs(tap->func, arg, tap->transforms, nullptr);
  Py_DECREF(arg);
  if (result != nullptr) return result;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* told = CallOne(tap->failed, device_id);
  if (told == nullptr) {  // what it raised goes on, as in Python
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return nullptr;
  }
  Py_DECREF(told);
  PyErr_Restore(type, value, traceback);
  return nullptr;
}

PyObject* PlainTapCall(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject *arrays, *device_id;
  static const char* names[] = {"arrays", "device_id", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:plain_tap",
                                   const_cast<char**>(names), &arrays,
                                   &device_id)) {
    return nullptr;
  }
  return Run(reinterpret_cast<PlainTap*>(self), arrays, device_id);
}

using Owned = OwnedFields<PlainTap, kPlainTapFields, Fields>;

// The host function's name, as a Python consumer's would show it.
PyObject* PlainTapName(PyObject* self, void* /*closure*/) {
  PyObject* func = reinterpret_cast<PlainTap*>(self)->func;
  if (func == nullptr) return PyUnicode_FromString("plain_tap");
  return PyObject_GetAttrString(func, "__name__");
}

PyGetSetDef plain_tap_getset[] = {
    {"__name__", PlainTapName, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot plain_tap_slots[] = {
    {Py_tp_doc, const_cast<char*>(
        "A plain tap's consumer (receiver/native/python_plain_tap.h).")},
    {Py_tp_call, reinterpret_cast<void*>(PlainTapCall)},
    {Py_tp_traverse, reinterpret_cast<void*>(Owned::Traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(Owned::Clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(Owned::Dealloc)},
    {Py_tp_getset, plain_tap_getset},
    {0, nullptr},
};

PyType_Spec plain_tap_spec = {
    "host_callback.receiver._native.PlainTap", sizeof(PlainTap), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
        Py_TPFLAGS_DISALLOW_INSTANTIATION,
    plain_tap_slots,
};

// plain_tap(func, transforms, failed) -> the consumer (see the header).
PyObject* NewPlainTap(PyObject* /*module*/, PyObject* args) {
  PyObject *func, *transforms, *failed;
  if (!PyArg_ParseTuple(args, "OOO:plain_tap", &func, &transforms, &failed)) {
    return nullptr;
  }
  if (PlainTapType == nullptr) {
    PlainTapType =
        reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&plain_tap_spec));
    if (PlainTapType == nullptr) return nullptr;
  }
  return reinterpret_cast<PyObject*>(
      Owned::New(PlainTapType, {func, transforms, failed}));
}

}  // namespace

PyObject* RunConsumer(PyObject* consumer, PyObject* arrays,
                      PyObject* device_id) {
  if (PlainTapType != nullptr && Py_TYPE(consumer) == PlainTapType) {
    return Run(reinterpret_cast<PlainTap*>(consumer), arrays, device_id);
  }
  return PyObject_CallFunctionObjArgs(consumer, arrays, device_id, nullptr);
}

PyMethodDef kPlainTapMethods[] = {
    {"plain_tap", NewPlainTap, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
