// new_instance(cls, *values), in kInstanceMethods: a new instance of `cls`
// whose slots, in the order of cls.__slots__, are set to `values`; neither
// __init__ nor __setattr__ runs. An immutable (frozen) slots class is made
// so at about the cost of a tuple: its own __init__ sets each field through
// object.__setattr__, which costs several times more. Python reaches both
// functions through receiver/instances.py.
//
// instance_feed(cls, head, tail, devices, callback, failed, fallback): a
// consumer, `feed(arrays, device_id)`, that gives `callback` an instance of
// `cls` for each packet of two arrays, a number (a Python int >= 0) and a
// value, from a device whose id the dict `devices` holds: made as
// new_instance(cls, *head, number, value, *tail, device). Every other call
// (transforms, a negative number or none, a device not in `devices` yet,
// other arrays) goes to `fallback`, the same consumer in Python. An
// Exception raised by `callback` goes to `failed(callback, error)`. With
// no Python frame of the consumer's, an instance delivered costs less.
//
// What a class needs is found once (its slots' descriptors and their
// setters) and kept for the process: classes are few and live long.
// Everything here runs with the GIL, which guards the table.

#include "module_support.h"

#include <cstddef>
#include <deque>
#include <vector>

#include "python_instances.h"
#include "python_limited.h"
#include "python_owned_fields.h"

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

// A deque: a feed keeps a pointer to its class's entry, which adding
// another class must not move.
std::deque<SlotsClass>* classes = new std::deque<SlotsClass>();

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

// Whether `slots` takes `count` values; else false with a TypeError.
bool TakesValues(const SlotsClass& slots, size_t count, const char* caller) {
  if (count == slots.setters.size()) return true;
  PyErr_Format(PyExc_TypeError, "%s: the class has %zd slots, %zd values given",
               caller, static_cast<Py_ssize_t>(slots.setters.size()),
               static_cast<Py_ssize_t>(count));
  return false;
}

// An instance of `slots`'s class with its slots set to `values`, as many as
// it has slots.
PyObject* Make(const SlotsClass& slots, PyObject* const* values) {
  PyObject* instance = slots.alloc(slots.type, 0);
  for (size_t i = 0; instance != nullptr && i < slots.setters.size(); ++i) {
    if (slots.setters[i](slots.descriptors[i], instance, values[i]) < 0) {
      Py_CLEAR(instance);
    }
  }
  return instance;
}

}  // namespace

PyObject* NewSlotsInstance(PyTypeObject* type, PyObject* const* values,
                           size_t count) {
  const SlotsClass* slots = Find(type);
  if (slots == nullptr || !TakesValues(*slots, count, "new_instance")) {
    return nullptr;
  }
  return Make(*slots, values);
}

namespace {

PyObject* NewInstance(PyObject* /*module*/, PyObject* const* args,
                      Py_ssize_t nargs) {
  if (nargs < 1 || !PyType_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "new_instance(cls, *values)");
    return nullptr;
  }
  return NewSlotsInstance(reinterpret_cast<PyTypeObject*>(args[0]), args + 1,
                          static_cast<size_t>(nargs - 1));
}

// --- instance_feed -----------------------------------------------------------

struct FeedObject {
  PyObject_HEAD
  const SlotsClass* slots;
  // Owned references, in this order (Fields).
  PyObject* head;      // a tuple: the values before the number
  PyObject* tail;      // a tuple: the values between the value and the device
  PyObject* devices;   // a dict: device id -> device
  PyObject* callback;
  PyObject* failed;    // failed(callback, error)
  PyObject* fallback;  // the same consumer, in Python
};

constexpr int kFeedFields = 6;

// The owned fields as an array: six PyObject* in a row, with no padding.
PyObject** Fields(FeedObject* feed) { return &feed->head; }
static_assert(offsetof(FeedObject, fallback) ==
                  offsetof(FeedObject, head) +
                      (kFeedFields - 1) * sizeof(PyObject*),
              "the feed's owned fields lie in a row");

PyTypeObject* FeedType = nullptr;

// `arrays`' number and value where it is a tuple or a list of two whose
// first is an int >= 0; else false.
bool NumberAndValue(PyObject* arrays, PyObject** number, PyObject** value) {
  const bool tuple = PyTuple_Check(arrays);
  if (!tuple && !PyList_Check(arrays)) return false;
  if ((tuple ? PyTuple_Size(arrays) : PyList_Size(arrays)) != 2) return false;
  *number = tuple ? PyTuple_GetItem(arrays, 0) : PyList_GetItem(arrays, 0);
  *value = tuple ? PyTuple_GetItem(arrays, 1) : PyList_GetItem(arrays, 1);
  if (!PyLong_CheckExact(*number)) return false;
  int overflow;
  return PyLong_AsLongAndOverflow(*number, &overflow) >= 0 && overflow == 0;
}

// `callback(instance)`; an Exception goes to `failed(callback, error)`.
PyObject* Deliver(FeedObject* feed, PyObject* instance) {
  PyObject* result = CallOne(feed->callback, instance);
  if (result != nullptr) {
    Py_DECREF(result);
    Py_RETURN_NONE;
  }
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
  PyObject* error = TakeRaised();
  if (error == nullptr) return nullptr;
  result = PyObject_CallFunctionObjArgs(feed->failed, feed->callback, error,
                                        nullptr);
  Py_DECREF(error);
  if (result == nullptr) return nullptr;
  Py_DECREF(result);
  Py_RETURN_NONE;
}

PyObject* FeedCall(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* feed = reinterpret_cast<FeedObject*>(self);
  PyObject *number, *value, *device = nullptr;
  const bool plain = (kwargs == nullptr || PyDict_Size(kwargs) == 0) &&
                     PyTuple_Size(args) == 2 &&
                     NumberAndValue(PyTuple_GetItem(args, 0), &number, &value);
  if (plain) {
    device = PyDict_GetItemWithError(feed->devices, PyTuple_GetItem(args, 1));
    if (device == nullptr && PyErr_Occurred()) return nullptr;
  }
  if (device == nullptr) return PyObject_Call(feed->fallback, args, kwargs);
  const Py_ssize_t heads = PyTuple_Size(feed->head);
  const Py_ssize_t tails = PyTuple_Size(feed->tail);
  PyObject* values[16];  // the class's slots, checked when the feed was made
  for (Py_ssize_t i = 0; i < heads; ++i) {
    values[i] = PyTuple_GetItem(feed->head, i);
  }
  values[heads] = number;
  values[heads + 1] = value;
  for (Py_ssize_t i = 0; i < tails; ++i) {
    values[heads + 2 + i] = PyTuple_GetItem(feed->tail, i);
  }
  values[heads + 2 + tails] = device;
  // Held while the instance is made: its allocation may collect, and a
  // finalizer may change `devices` or `arrays`.
  Py_INCREF(number);
  Py_INCREF(value);
  Py_INCREF(device);
  PyObject* instance = Make(*feed->slots, values);
  Py_DECREF(number);
  Py_DECREF(value);
  Py_DECREF(device);
  if (instance == nullptr) return nullptr;
  PyObject* outcome = Deliver(feed, instance);
  Py_DECREF(instance);
  return outcome;
}

using FeedFields = OwnedFields<FeedObject, kFeedFields, Fields>;

// The fallback's name: what a printed jaxpr and an error name the feed by.
PyObject* FeedName(PyObject* self, void* /*closure*/) {
  PyObject* fallback = reinterpret_cast<FeedObject*>(self)->fallback;
  if (fallback == nullptr) return PyUnicode_FromString("instance_feed");
  return PyObject_GetAttrString(fallback, "__name__");
}

PyGetSetDef feed_getset[] = {
    {"__name__", FeedName, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot feed_slots[] = {
    {Py_tp_doc, const_cast<char*>(
        "A consumer made by instance_feed (receiver/native/"
        "python_instances.cc).")},
    {Py_tp_call, reinterpret_cast<void*>(FeedCall)},
    {Py_tp_traverse, reinterpret_cast<void*>(FeedFields::Traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(FeedFields::Clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(FeedFields::Dealloc)},
    {Py_tp_getset, feed_getset},
    {0, nullptr},
};

PyType_Spec feed_spec = {
    "host_callback.receiver._native.InstanceFeed", sizeof(FeedObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
        Py_TPFLAGS_DISALLOW_INSTANTIATION,
    feed_slots,
};

PyObject* InstanceFeed(PyObject* /*module*/, PyObject* args) {
  PyObject *cls, *head, *tail, *devices, *callback, *failed, *fallback;
  if (!PyArg_ParseTuple(args, "O!O!O!O!OOO:instance_feed", &PyType_Type, &cls,
                        &PyTuple_Type, &head, &PyTuple_Type, &tail,
                        &PyDict_Type, &devices, &callback, &failed,
                        &fallback)) {
    return nullptr;
  }
  const SlotsClass* slots = Find(reinterpret_cast<PyTypeObject*>(cls));
  if (slots == nullptr ||
      !TakesValues(*slots, PyTuple_Size(head) + PyTuple_Size(tail) + 3,
                   "instance_feed")) {
    return nullptr;
  }
  if (slots->setters.size() > 16) {
    PyErr_SetString(PyExc_TypeError, "instance_feed: at most 16 slots");
    return nullptr;
  }
  if (FeedType == nullptr) {
    FeedType = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&feed_spec));
    if (FeedType == nullptr) return nullptr;
  }
  FeedObject* feed = FeedFields::New(
      FeedType, {head, tail, devices, callback, failed, fallback});
  if (feed != nullptr) feed->slots = slots;
  return reinterpret_cast<PyObject*>(feed);
}

}  // namespace

PyMethodDef kInstanceMethods[] = {
    {"new_instance", reinterpret_cast<PyCFunction>(
                         reinterpret_cast<void (*)()>(NewInstance)),
     METH_FASTCALL, nullptr},
    {"instance_feed", InstanceFeed, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
