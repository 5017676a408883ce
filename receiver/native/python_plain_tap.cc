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
  PyObject* failed;          // failed(device_id)
  PyObject* device_kwargs;   // device_kwargs(device_id) -> dict, or None
  PyObject* kwargs_by_device;  // device_kwargs' results by device_id
};

constexpr int kPlainTapFields = 5;

PyObject** Fields(PlainTap* tap) { return &tap->func; }

PyTypeObject* PlainTapType = nullptr;

// The keyword arguments of a tap on `device_id` (a borrowed reference,
// kept in `kwargs_by_device`), or null with the exception set.
PyObject* KwargsOf(PlainTap* tap, PyObject* device_id) {
  PyObject* kwargs = PyDict_GetItemWithError(tap->kwargs_by_device, device_id);
  if (kwargs != nullptr || PyErr_Occurred()) return kwargs;
  PyObject* made = CallOne(tap->device_kwargs, device_id);
  if (made == nullptr) return nullptr;
  const int stored = PyDict_SetItem(tap->kwargs_by_device, device_id, made);
  Py_DECREF(made);  // the dict keeps it
  return stored < 0 ? nullptr : made;
}

// `func(arrays[0], transforms[, **device_kwargs(device_id)])`.
PyObject* CallFunc(PlainTap* tap, PyObject* arg, PyObject* device_id) {
  if (tap->device_kwargs == Py_None) {
    return PyObject_CallFunctionObjArgs(tap->func, arg, tap->transforms,
                                        nullptr);
  }
  PyObject* kwargs = KwargsOf(tap, device_id);
  if (kwargs == nullptr) return nullptr;
  PyObject* args = PyTuple_Pack(2, arg, tap->transforms);
  if (args == nullptr) return nullptr;
  PyObject* result = PyObject_Call(tap->func, args, kwargs);
  Py_DECREF(args);
  return result;
}

// CallFunc; on an exception, `failed(device_id)` first.
PyObject* Run(PlainTap* tap, PyObject* arrays, PyObject* device_id) {
  PyObject* arg = PySequence_GetItem(arrays, 0);
  if (arg == nullptr) return nullptr;
  PyObject* result = CallFunc(tap, arg, device_id);
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

// plain_tap(func, transforms, failed, device_kwargs) -> the consumer (see
// the header).
PyObject* NewPlainTap(PyObject* /*module*/, PyObject* args) {
  PyObject *func, *transforms, *failed, *device_kwargs;
  if (!PyArg_ParseTuple(args, "OOOO:plain_tap", &func, &transforms, &failed,
                        &device_kwargs)) {
    return nullptr;
  }
  if (PlainTapType == nullptr) {
    PlainTapType =
        reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&plain_tap_spec));
    if (PlainTapType == nullptr) return nullptr;
  }
  PyObject* kwargs_by_device = PyDict_New();
  if (kwargs_by_device == nullptr) return nullptr;
  PyObject* tap = reinterpret_cast<PyObject*>(Owned::New(
      PlainTapType,
      {func, transforms, failed, device_kwargs, kwargs_by_device}));
  Py_DECREF(kwargs_by_device);
  return tap;
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
