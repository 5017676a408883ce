// new_instance(cls, *values), in kInstanceMethods: a new instance of `cls`
// whose slots, in the order of cls.__slots__, are set to `values`; neither
// __init__ nor __setattr__ runs. An immutable (frozen) slots class is made
// so at about the cost of a tuple: its own __init__ sets each field through
// object.__setattr__, which costs several times more. host_callback.loops
// makes each TapEvent so (host_callback/loops/events.py:site_events and
// emission.py:host_side), through receiver/native_library.py.
//
// What a class needs is found once (its slots' descriptors and their
// setters) and kept for the process: classes are few and live long.
// Everything here runs with the GIL, which guards the table.

#include "module_support.h"

#include <vector>

#include "python_limited.h"

namespace hcb::python {
namespace {

// A class's allocator and its slots' descriptors with their setters, each
// reference owned (and never dropped: see above).
struct SlotsClass {
  PyTypeObject* type;
  allocfunc alloc;
  std::vector<PyObject*> descriptors;
  std::vector<descrsetfunc> setters;
};

std::vector<SlotsClass>* classes = new std::vector<SlotsClass>();

// What `type` needs, found once; null with an exception set where `type`
// is not a class with __slots__ whose every name is a settable descriptor.
const SlotsClass* Find(PyTypeObject* type) {
  for (const SlotsClass& known : *classes) {
    if (known.type == type) return &known;
  }
  PyObject* object = reinterpret_cast<PyObject*>(type);
  PyObject* names = PyObject_GetAttrString(object, "__slots__");
  PyObject* sequence =
      names == nullptr
          ? nullptr
          : PySequence_Fast(names, "new_instance: __slots__ is a sequence");
  Py_XDECREF(names);
  if (sequence == nullptr) return nullptr;
  SlotsClass found{type,
                   reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc)),
                   {}, {}};
  bool ok = found.alloc != nullptr;
  for (Py_ssize_t i = 0; ok && i < FastSize(sequence); ++i) {
    PyObject* descriptor = PyObject_GetAttr(object, FastItem(sequence, i));
    auto setter = descriptor == nullptr
                      ? nullptr
                      : reinterpret_cast<descrsetfunc>(PyType_GetSlot(
                            Py_TYPE(descriptor), Py_tp_descr_set));
    if (setter == nullptr) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError,
                        "new_instance: a name in __slots__ is not a slot");
      }
      Py_XDECREF(descriptor);
      ok = false;
    } else {
      found.descriptors.push_back(descriptor);
      found.setters.push_back(setter);
    }
  }
  Py_DECREF(sequence);
  if (!ok) {
    for (PyObject* descriptor : found.descriptors) Py_DECREF(descriptor);
    return nullptr;
  }
  Py_INCREF(object);
  classes->push_back(std::move(found));
  return &classes->back();
}

PyObject* NewInstance(PyObject* /*module*/, PyObject* const* args,
                      Py_ssize_t nargs) {
  if (nargs < 1 || !PyType_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "new_instance(cls, *values)");
    return nullptr;
  }
  const SlotsClass* slots = Find(reinterpret_cast<PyTypeObject*>(args[0]));
  if (slots == nullptr) return nullptr;
  const size_t count = slots->setters.size();
  if (static_cast<size_t>(nargs - 1) != count) {
    PyErr_Format(PyExc_TypeError,
                 "new_instance: the class has %zd slots, %zd values given",
                 static_cast<Py_ssize_t>(count), nargs - 1);
    return nullptr;
  }
  PyObject* instance = slots->alloc(slots->type, 0);
  for (size_t i = 0; instance != nullptr && i < count; ++i) {
    if (slots->setters[i](slots->descriptors[i], instance, args[i + 1]) < 0) {
      Py_CLEAR(instance);
    }
  }
  return instance;
}

}  // namespace

PyMethodDef kInstanceMethods[] = {
    {"new_instance", reinterpret_cast<PyCFunction>(
                         reinterpret_cast<void (*)()>(NewInstance)),
     METH_FASTCALL, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
