// What the last few dispatches on each thread output: see
// dispatched_outputs.h.
//
// The weak references, to the first and the last array of each output
// (the step's state outlives the loss it drops, or the other way round),
// live in a list in the thread's state dict, which Python drops with the
// thread; which dispatch each entry is of lives in a
// thread_local array beside it. A thread state made for one call (a
// thread that Python did not start) leaves no list behind for the next:
// its entries then count as unknown.

#include "dispatched_outputs.h"

namespace hcb::python {
namespace {

PyObject* array_type = nullptr;  // a strong reference
PyObject* slots_key = nullptr;   // the list's key in the thread state dict
PyObject* is_ready = nullptr;    // the names of the arrays' methods
PyObject* block_until_ready = nullptr;

// The number of the dispatch each entry of the list is of; 0: none.
thread_local int64_t noted[kDispatchesFollowed] = {};

// The calling thread's list of weak references (borrowed), made with
// `make` where it has none; null where there is none, with no exception.
PyObject* Slots(bool make) {
  PyObject* dict = PyThreadState_GetDict();  // borrowed; never raises
  if (dict == nullptr) return nullptr;
  PyObject* slots = PyDict_GetItemWithError(dict, slots_key);
  if (slots != nullptr || PyErr_Occurred() || !make) {
    PyErr_Clear();
    return slots;
  }
  slots = PyList_New(2 * kDispatchesFollowed);
  if (slots == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < 2 * kDispatchesFollowed; ++i) {
    Py_INCREF(Py_None);
    PyList_SetItem(slots, i, Py_None);
  }
  const int stored = PyDict_SetItem(dict, slots_key, slots);
  Py_DECREF(slots);  // the dict keeps it
  if (stored < 0) {
    PyErr_Clear();
    return nullptr;
  }
  return slots;
}

// The first array among the leaves of `tree`, an output as JAX's dispatch
// passes it (an array, or tuples, lists and dicts of them), or `from_end`
// the last one (of a dict, among its last value's leaves); null where none
// is found in `*budget` nodes (another container type, say).
PyObject* EndArray(PyObject* tree, bool from_end, int* budget) {
  if (--*budget < 0) return nullptr;
  if (Py_TYPE(tree) == reinterpret_cast<PyTypeObject*>(array_type)) {
    return tree;
  }
  if (PyTuple_Check(tree) || PyList_Check(tree)) {
    const Py_ssize_t n = FastSize(tree);
    for (Py_ssize_t i = 0; i < n && *budget > 0; ++i) {
      PyObject* item = FastItem(tree, from_end ? n - 1 - i : i);
      if (PyObject* found = EndArray(item, from_end, budget)) return found;
    }
  } else if (PyDict_Check(tree)) {
    Py_ssize_t position = 0;
    PyObject *key, *value, *last = nullptr;
    while (PyDict_Next(tree, &position, &key, &value)) {
      if (!from_end) {
        if (PyObject* found = EndArray(value, false, budget)) return found;
        if (*budget <= 0) return nullptr;
      }
      last = value;
    }
    if (last != nullptr) return EndArray(last, true, budget);
  }
  return nullptr;
}

// Puts a weak reference to `array` into entry `index` of `slots`; None
// where none can be made.
void Keep(PyObject* slots, Py_ssize_t index, PyObject* array) {
  PyObject* reference = PyWeakref_NewRef(array, nullptr);
  if (reference == nullptr) {
    PyErr_Clear();
    Py_INCREF(Py_None);
    reference = Py_None;
  }
  PyList_SetItem(slots, index, reference);  // drops the entry's old one
}

// The array that `reference` refers to (a new reference); null where it
// is gone or `reference` is None, with no exception.
PyObject* Referent(PyObject* reference) {
  PyObject* array =
      reference == Py_None ? nullptr : PyObject_CallNoArgs(reference);
  if (array == nullptr || array == Py_None) {
    PyErr_Clear();
    Py_XDECREF(array);
    return nullptr;
  }
  return array;
}

// Whether the array that `reference` refers to is ready: 1 or 0; -1 where
// it cannot tell (the array is gone or deleted, or `reference` is None).
int Ready(PyObject* reference) {
  PyObject* array = Referent(reference);
  if (array == nullptr) return -1;
  PyObject* ready = PyObject_CallMethodObjArgs(array, is_ready, nullptr);
  Py_DECREF(array);
  if (ready == nullptr) {
    PyErr_Clear();
    return -1;
  }
  Py_DECREF(ready);
  return ready == Py_True ? 1 : 0;
}

// The calling thread's list of weak references (borrowed) where each of
// its dispatches numbered after `after`, up to `last` (at least one, and
// at most kDispatchesFollowed), was noted; null where one was not.
PyObject* NotedSlots(int64_t after, int64_t last) {
  if (last <= after || last - after > kDispatchesFollowed) return nullptr;
  for (int64_t number = after + 1; number <= last; ++number) {
    if (noted[number % kDispatchesFollowed] != number) return nullptr;
  }
  return Slots(false);
}

}  // namespace

void SetDispatchedArrayType(PyObject* type) {
  if (slots_key == nullptr) {
    slots_key = PyUnicode_InternFromString("host_callback.dispatched_outputs");
    is_ready = PyUnicode_InternFromString("is_ready");
    block_until_ready = PyUnicode_InternFromString("block_until_ready");
    if (slots_key == nullptr || is_ready == nullptr ||
        block_until_ready == nullptr) {
      PyErr_Clear();
      Py_CLEAR(slots_key);
      Py_CLEAR(is_ready);
      Py_CLEAR(block_until_ready);
      return;
    }
  }
  Py_INCREF(type);
  Replace(&array_type, type);
}

void NoteDispatchedOutput(PyObject* output, int64_t number) {
  const int64_t entry = number % kDispatchesFollowed;
  noted[entry] = 0;  // unknown until noted
  if (array_type == nullptr || slots_key == nullptr || output == nullptr) {
    return;
  }
  int budget = 32;
  PyObject* first = EndArray(output, false, &budget);
  budget = 32;
  PyObject* last = first == nullptr ? nullptr : EndArray(output, true, &budget);
  PyObject* slots = first == nullptr ? nullptr : Slots(true);
  if (slots == nullptr) return;
  Keep(slots, 2 * entry, first);
  Keep(slots, 2 * entry + 1, last == nullptr ? first : last);
  noted[entry] = number;
}

bool DispatchesFinished(int64_t after, int64_t last) {
  if (last == after) return true;  // none since
  PyObject* slots = NotedSlots(after, last);
  if (slots == nullptr) return false;
  for (int64_t number = after + 1; number <= last; ++number) {
    const int64_t entry = number % kDispatchesFollowed;
    // One array ready suffices: none is before the execution's end.
    const int first = Ready(PyList_GetItem(slots, 2 * entry));
    if (first == 0 ||
        (first < 0 && Ready(PyList_GetItem(slots, 2 * entry + 1)) != 1)) {
      return false;
    }
  }
  return true;
}

int AwaitDispatches(int64_t after, int64_t last) {
  PyObject* slots = NotedSlots(after, last);
  if (slots == nullptr) return 0;
  for (int64_t number = after + 1; number <= last; ++number) {
    const int64_t entry = number % kDispatchesFollowed;
    PyObject* array = Referent(PyList_GetItem(slots, 2 * entry));
    if (array == nullptr) {
      array = Referent(PyList_GetItem(slots, 2 * entry + 1));
    }
    if (array == nullptr) return 0;
    PyObject* waited =
        PyObject_CallMethodObjArgs(array, block_until_ready, nullptr);
    Py_DECREF(array);
    if (waited == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
      PyErr_Clear();  // a deleted array, or its computation's error
      return 0;
    }
    Py_DECREF(waited);
  }
  return 1;
}

}  // namespace hcb::python
