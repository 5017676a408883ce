// barrier_wait's idle check in one call: whether a barrier on the calling
// thread would find nothing to wait for, release or raise, so that an idle
// barrier costs this call instead of its probes.
//
// A barrier that waited on the probes of every device records, on its
// thread, the dispatches it began with (dispatches.h) and a count that the
// Python side keeps (the computations over several devices lowered). The
// barrier after it is idle while: the calling thread runs no host function
// of ours; those counts are the same (the dispatches on every thread too,
// once that count is not 0); at most the executions that barriers gave up
// on are in flight (executions.h); every native queue is drained; and the
// watches the Python side configured hold: attributes that must be empty
// (a pending error, a retired consumer, the runtime tokens a dispatch left),
// attributes that must be a given object (the hook that counts dispatches)
// and functions that must return true while an attribute is not empty (the
// other transports drained, once they opened a queue). The
// Python side is host_callback/barrier/idle.py.

#include "module_support.h"

#include <cstdint>

#include "dispatches.h"
#include "executions.h"
#include "python_runner.h"

namespace hcb::python {
namespace {

// What idle_check_configure was given; strong references, kept for the
// module's life (replaced by a later configure).
struct Watches {
  PyObject* given_up = nullptr;   // (object, attribute): an int
  PyObject* lowerings = nullptr;  // (object, attribute): an int
  PyObject* empty = nullptr;      // ((object, attribute), ...)
  PyObject* same = nullptr;       // ((object, attribute, expected), ...)
  PyObject* drained = nullptr;    // ((object, attribute, callable), ...)
  int64_t generation = 0;         // bumped by each configure
};
Watches watches;

// The counts a barrier on this thread began with (`pending`) and those of
// the last one that waited on the probes of every device (`waited`).
struct Counts {
  int64_t generation = -1;  // -1: none
  int64_t on_this_thread = 0;
  int64_t on_all = 0;
  int64_t lowerings = 0;
};
thread_local Counts pending;
thread_local Counts waited;

// getattr(watch[0], watch[1]), a new reference; nullptr with an exception.
PyObject* Attribute(PyObject* watch) {
  return PyObject_GetAttr(PyTuple_GetItem(watch, 0), PyTuple_GetItem(watch, 1));
}

// The int at `pair` = (object, attribute); false with an exception set.
bool ReadInt(PyObject* pair, int64_t* out) {
  PyObject* value = Attribute(pair);
  if (value == nullptr) return false;
  *out = PyLong_AsLongLong(value);
  Py_DECREF(value);
  return !PyErr_Occurred();
}

// 1 when every watch holds, 0 when one does not, -1 with an exception set.
int WatchesHold() {
  for (Py_ssize_t i = 0, n = PyTuple_Size(watches.empty); i < n; ++i) {
    PyObject* pair = PyTuple_GetItem(watches.empty, i);
    PyObject* value = Attribute(pair);
    if (value == nullptr) return -1;
    const int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth != 0) return truth < 0 ? -1 : 0;
  }
  for (Py_ssize_t i = 0, n = PyTuple_Size(watches.same); i < n; ++i) {
    PyObject* triple = PyTuple_GetItem(watches.same, i);
    PyObject* value = Attribute(triple);
    if (value == nullptr) return -1;
    Py_DECREF(value);  // only its identity is compared
    if (value != PyTuple_GetItem(triple, 2)) return 0;
  }
  for (Py_ssize_t i = 0, n = PyTuple_Size(watches.drained); i < n; ++i) {
    PyObject* triple = PyTuple_GetItem(watches.drained, i);
    PyObject* value = Attribute(triple);
    if (value == nullptr) return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth <= 0) {  // empty (nothing to call), or an error
      if (truth < 0) return -1;
      continue;
    }
    PyObject* result =
        PyObject_CallObject(PyTuple_GetItem(triple, 2), nullptr);
    if (result == nullptr) return -1;
    truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    if (truth <= 0) return truth;
  }
  return 1;
}

// idle_check_configure(given_up, lowerings, empty, same, drained): see
// Watches; forgets every thread's recorded counts.
PyObject* Configure(PyObject*, PyObject* args) {
  PyObject *given_up, *lowerings, *empty, *same, *drained;
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyTuple_Type, &given_up,
                        &PyTuple_Type, &lowerings, &PyTuple_Type, &empty,
                        &PyTuple_Type, &same, &PyTuple_Type, &drained)) {
    return nullptr;
  }
  PyObject* const given[] = {given_up, lowerings, empty, same, drained};
  PyObject** const slots[] = {&watches.given_up, &watches.lowerings,
                              &watches.empty, &watches.same, &watches.drained};
  for (int i = 0; i < 5; ++i) {
    PyObject* old = *slots[i];
    Py_INCREF(given[i]);
    *slots[i] = given[i];
    Py_XDECREF(old);
  }
  ++watches.generation;
  Py_RETURN_NONE;
}

// idle_check_begin(): a barrier on this thread is about to wait on the
// probes of every device; notes the counts it begins with.
PyObject* Begin(PyObject*, PyObject*) {
  if (watches.given_up == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "idle_check_configure was not called");
    return nullptr;
  }
  Counts counts;
  if (!ReadInt(watches.lowerings, &counts.lowerings)) return nullptr;
  const Dispatches& dispatches = Dispatches::Get();
  counts.on_this_thread = dispatches.OnThisThread();
  counts.on_all = dispatches.All();
  counts.generation = watches.generation;
  pending = counts;
  Py_RETURN_NONE;
}

// idle_check_waited(covered): the barrier that began waited; with `covered`
// true its probes covered every device and the next barrier on this thread
// may be idle, with false it may not.
PyObject* Waited(PyObject*, PyObject* covered) {
  const int truth = PyObject_IsTrue(covered);
  if (truth < 0) return nullptr;
  waited = truth ? pending : Counts{};
  pending = Counts{};
  Py_RETURN_NONE;
}

// idle_now() -> whether a barrier on this thread is idle (see the top).
PyObject* IdleNow(PyObject*, PyObject*) {
  const Counts& last = waited;
  if (last.generation != watches.generation || RunsHostFunctionHere()) {
    Py_RETURN_FALSE;
  }
  int64_t lowerings, given_up;
  if (!ReadInt(watches.lowerings, &lowerings)) return nullptr;
  const Dispatches& dispatches = Dispatches::Get();
  if (lowerings != last.lowerings ||
      dispatches.OnThisThread() != last.on_this_thread ||
      (lowerings != 0 && dispatches.All() != last.on_all)) {
    Py_RETURN_FALSE;
  }
  if (!ReadInt(watches.given_up, &given_up)) return nullptr;
  if (Executions::Get().InFlight() > given_up) Py_RETURN_FALSE;
  PyObject* drained =
      CatchToPython([] { return PyBool_FromLong(hub().Drained()); });
  if (drained != Py_True) return drained;
  Py_DECREF(drained);
  const int hold = WatchesHold();
  if (hold < 0) return nullptr;
  return PyBool_FromLong(hold);
}

}  // namespace

PyMethodDef kIdleCheckMethods[] = {
    {"idle_check_configure", Configure, METH_VARARGS, nullptr},
    {"idle_check_begin", Begin, METH_NOARGS, nullptr},
    {"idle_check_waited", Waited, METH_O, nullptr},
    {"idle_now", IdleNow, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
