// barrier_wait's idle check in one call: whether a barrier on the calling
// thread would find nothing to wait for, release or raise, so that an idle
// barrier costs this call instead of its probes.
//
// A barrier that waited on the probes of every device records, on its
// thread, the dispatches it began with (dispatches.h) and a count that the
// Python side keeps (the computations over several devices lowered). The
// barrier after it is idle while: the calling thread runs no host function
// of ours; the count of lowerings is the same; each dispatch on this
// thread since is known to have finished (dispatched_outputs.h: a few at
// most; the training step that a barrier follows, typically), and none was
// made on another thread once that count is not 0; at most the executions
// that barriers gave up on are in flight (executions.h); every native
// queue is drained; and the watches the Python side configured hold:
// attributes that must be empty
// (a pending error, a retired consumer, the runtime tokens a dispatch left),
// attributes that must be a given object (the hook that counts dispatches)
// and dicts of queues whose every queue has finished what was enqueued
// (the Python transport's); an object given as its namespace dict is read
// there. An idle barrier after finished dispatches records their counts
// as a barrier that waited would. A barrier that is not idle first waits
// for those dispatches where it can (AwaitDispatchesSinceWaited), then
// checks again; if not idle yet, it runs the taps they left waiting on the
// queues (the outfeed mode's) and checks once more. The Python side is
// host_callback/barrier/idle.py and
// receiver/native_library.py:configure_idle_check.

#include "module_support.h"

#include <cstdint>
#include <string>

#include "dispatched_outputs.h"
#include "dispatches.h"
#include "executions.h"
#include "python_limited.h"
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
  PyObject* drained = nullptr;    // ((object, attribute, enqueued,
                                  //   finished), ...)
  int64_t consumed_here = 0;      // the most taps waiting on a queue
                                  //   that a barrier runs itself
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
// A watch[0] that is a dict is the object's namespace (the Python side
// passes it where the attribute lives there): a lookup in it is the read.
PyObject* Attribute(PyObject* watch) {
  PyObject* owner = PyTuple_GetItem(watch, 0);
  PyObject* attribute = PyTuple_GetItem(watch, 1);
  if (!PyDict_CheckExact(owner)) return PyObject_GetAttr(owner, attribute);
  PyObject* value = PyDict_GetItemWithError(owner, attribute);  // borrowed
  if (value == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, attribute);
    return nullptr;
  }
  Py_INCREF(value);
  return value;
}

// The int at `pair` = (object, attribute); false with an exception set.
bool ReadInt(PyObject* pair, int64_t* out) {
  PyObject* value = Attribute(pair);
  if (value == nullptr) return false;
  *out = PyLong_AsLongLong(value);
  Py_DECREF(value);
  return !PyErr_Occurred();
}

// Whether every value of the dict `queues` has as many packets finished
// (attribute `finished`) as enqueued (attribute `enqueued`): 1 or 0, -1
// with an exception set. The finished count is read first, so that a
// packet enqueued meanwhile counts as waiting (under the GIL nothing runs
// meanwhile).
int AllDrained(PyObject* queues, PyObject* enqueued, PyObject* finished) {
  if (!PyDict_Check(queues)) {
    PyErr_SetString(PyExc_TypeError, "idle check: the queues are no dict");
    return -1;
  }
  Py_ssize_t position = 0;
  PyObject *key, *queue;
  while (PyDict_Next(queues, &position, &key, &queue)) {
    // The counts, read in the queue's namespace: two ints, whose
    // comparison runs no Python code while the references are borrowed.
    PyObject* names = PyObject_GenericGetDict(queue, nullptr);
    if (names == nullptr) return -1;
    PyObject* done = PyDict_GetItemWithError(names, finished);
    PyObject* sent =
        done == nullptr ? nullptr : PyDict_GetItemWithError(names, enqueued);
    if (sent == nullptr) {
      Py_DECREF(names);
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_AttributeError, "idle check: no queue counts");
      }
      return -1;
    }
    const int equal = PyObject_RichCompareBool(sent, done, Py_EQ);
    Py_DECREF(names);
    if (equal <= 0) return equal;
  }
  return 1;
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
    PyObject* watch = PyTuple_GetItem(watches.drained, i);
    PyObject* queues = Attribute(watch);
    if (queues == nullptr) return -1;
    const int drained = AllDrained(queues, PyTuple_GetItem(watch, 2),
                                   PyTuple_GetItem(watch, 3));
    Py_DECREF(queues);
    if (drained <= 0) return drained;
  }
  return 1;
}

// idle_check_configure(given_up, lowerings, empty, same, drained,
// array_type, consumed_here): see Watches, and dispatched_outputs.h for
// `array_type`, the type of the arrays a dispatch outputs; forgets every
// thread's recorded counts.
PyObject* Configure(PyObject*, PyObject* args) {
  PyObject *given_up, *lowerings, *empty, *same, *drained, *array_type;
  long long consumed_here;
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!L", &PyTuple_Type, &given_up,
                        &PyTuple_Type, &lowerings, &PyTuple_Type, &empty,
                        &PyTuple_Type, &same, &PyTuple_Type, &drained,
                        &PyType_Type, &array_type, &consumed_here)) {
    return nullptr;
  }
  watches.consumed_here = consumed_here;
  SetDispatchedArrayType(array_type);
  PyObject* const given[] = {given_up, lowerings, empty, same, drained};
  PyObject** const slots[] = {&watches.given_up, &watches.lowerings,
                              &watches.empty, &watches.same, &watches.drained};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(given[i]);
    Replace(slots[i], given[i]);
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

// Whether a barrier on this thread is idle (see the top): 1 or 0, -1 with
// an exception set. Where it is after dispatches, records their counts.
int Idle() {
  Counts& last = waited;
  if (last.generation != watches.generation || RunsHostFunctionHere()) {
    return 0;
  }
  int64_t lowerings, given_up;
  if (!ReadInt(watches.lowerings, &lowerings)) return -1;
  const Dispatches& dispatches = Dispatches::Get();
  const int64_t on_this_thread = dispatches.OnThisThread();
  const int64_t on_all = dispatches.All();
  // Before the executions in flight are read: the dispatches' executions
  // have ended by then.
  if (lowerings != last.lowerings ||
      (lowerings != 0 &&
       on_all - last.on_all != on_this_thread - last.on_this_thread) ||
      !DispatchesFinished(last.on_this_thread, on_this_thread)) {
    return 0;
  }
  if (!ReadInt(watches.given_up, &given_up)) return -1;
  if (Executions::Get().InFlight() > given_up) return 0;
  PyObject* drained =
      CatchToPython([] { return PyBool_FromLong(hub().Drained()); });
  if (drained == nullptr) return -1;
  Py_DECREF(drained);
  if (drained != Py_True) return 0;
  const int hold = WatchesHold();
  if (hold == 1) {
    last.on_this_thread = on_this_thread;
    last.on_all = on_all;
  }
  return hold;
}

// Before a barrier on this thread that is not idle waits on its probes:
// where the last barrier that waited left counts (it covered every
// device), waits for this thread's dispatches since, each of which has a
// noted array alive (the training step that the barrier follows), as the
// probes would, in one call. 1 when it waited for them all (the barrier
// may be idle now), 0 where it could not, -1 with an exception set.
int AwaitDispatchesSinceWaited() {
  if (waited.generation != watches.generation || RunsHostFunctionHere()) {
    return 0;
  }
  return AwaitDispatches(waited.on_this_thread,
                         Dispatches::Get().OnThisThread());
}

// Once the dispatches since the last barrier that waited have finished
// (AwaitDispatchesSinceWaited), what a barrier still waits for is
// typically their taps, queued in the outfeed mode: runs those here, as
// the Python barrier would (`consume_here`), with no hand-off to a
// receiver thread. 0, or -1 with KeyboardInterrupt set where Ctrl-C
// stopped one (which the Python barrier raises too).
int RunWaitingTapsHere() {
  const GuestOutcome outcome = hub().RunWaitingTaps(watches.consumed_here);
  if (outcome != GuestOutcome::kInterrupted) return 0;
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  return -1;
}

// idle_now() -> whether a barrier on this thread is idle (see the top).
PyObject* IdleNow(PyObject*, PyObject*) {
  const int idle = Idle();
  return idle < 0 ? nullptr : PyBool_FromLong(idle);
}

// idle_check_forget(): no barrier is idle until one waits after the next
// idle_check_configure.
PyObject* Forget(PyObject*, PyObject*) {
  ++watches.generation;
  Py_RETURN_NONE;
}

// The barrier that idle_barrier made: its Python barrier and the check of
// whether it logs; strong references, kept for the module's life.
struct Barrier {
  PyObject* wait = nullptr;
  PyObject* logs = nullptr;
  PyObject* logging_name = nullptr;  // the keyword, interned
  std::string doc;                   // its PyMethodDef's, kept as long
};
Barrier barrier;

// `barrier_wait(logging_name=None)`: None at once where the barrier is idle
// (perhaps once the dispatches since the last barrier have finished) and
// `logs()` is false; else what `wait(logging_name)` returns. Arguments
// it does not take go to `wait`, which rejects them.
PyObject* BarrierWait(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_Size(kwnames);
  const bool takes = nargs + keywords <= 1 &&
                     (keywords == 0 || PyUnicode_Compare(PyTuple_GetItem(
                                           kwnames, 0),
                                       barrier.logging_name) == 0);
  if (takes) {
    int idle = Idle();
    // Without an argument (the drain at exit names itself): what the
    // probes would wait for first, the step just dispatched, here.
    if (idle == 0 && nargs + keywords == 0) {
      const int awaited = AwaitDispatchesSinceWaited();
      if (awaited < 0) return nullptr;
      if (awaited == 1) {
        idle = Idle();
        if (idle == 0) {
          if (RunWaitingTapsHere() < 0) return nullptr;
          idle = Idle();
        }
      }
    }
    if (idle < 0) return nullptr;
    if (idle == 1) {
      PyObject* logs = PyObject_CallNoArgs(barrier.logs);
      if (logs == nullptr) return nullptr;
      const int truth = PyObject_IsTrue(logs);
      Py_DECREF(logs);
      if (truth < 0) return nullptr;
      if (truth == 0) Py_RETURN_NONE;
    }
  }
  // The barrier waits: a tuple and a dict cost nothing beside it (and the
  // stable ABI of Python 3.11 has no PyObject_Vectorcall).
  PyObject* positional = PyTuple_New(nargs);
  PyObject* named = keywords > 0 ? PyDict_New() : nullptr;
  bool ok = positional != nullptr && (keywords == 0 || named != nullptr);
  for (Py_ssize_t i = 0; ok && i < nargs; ++i) {
    Py_INCREF(args[i]);
    ok = PyTuple_SetItem(positional, i, args[i]) == 0;
  }
  for (Py_ssize_t i = 0; ok && i < keywords; ++i) {
    ok = PyDict_SetItem(named, PyTuple_GetItem(kwnames, i),
                        args[nargs + i]) == 0;
  }
  PyObject* result =
      ok ? PyObject_Call(barrier.wait, positional, named) : nullptr;
  Py_XDECREF(positional);
  Py_XDECREF(named);
  return result;
}

PyMethodDef barrier_def = {"barrier_wait",
                           reinterpret_cast<PyCFunction>(
                               reinterpret_cast<void (*)()>(BarrierWait)),
                           METH_FASTCALL | METH_KEYWORDS, nullptr};

// idle_barrier(wait, logs, doc, module) -> `barrier_wait` (BarrierWait),
// whose __doc__ is `doc` and __module__ `module`. Once per process: later
// calls return a new function over the same barrier.
PyObject* IdleBarrier(PyObject*, PyObject* args) {
  PyObject *wait, *logs, *module;
  const char* doc;
  if (!PyArg_ParseTuple(args, "OOsU", &wait, &logs, &doc, &module)) {
    return nullptr;
  }
  if (barrier.wait == nullptr) {
    barrier.logging_name = PyUnicode_InternFromString("logging_name");
    if (barrier.logging_name == nullptr) return nullptr;
    Py_INCREF(wait);
    Py_INCREF(logs);
    barrier.wait = wait;
    barrier.logs = logs;
    barrier.doc = doc;
    barrier_def.ml_doc = barrier.doc.c_str();
  }
  return PyCFunction_NewEx(&barrier_def, nullptr, module);
}

}  // namespace

PyMethodDef kIdleCheckMethods[] = {
    {"idle_check_configure", Configure, METH_VARARGS, nullptr},
    {"idle_check_begin", Begin, METH_NOARGS, nullptr},
    {"idle_check_waited", Waited, METH_O, nullptr},
    {"idle_now", IdleNow, METH_NOARGS, nullptr},
    {"idle_check_forget", Forget, METH_NOARGS, nullptr},
    {"idle_barrier", IdleBarrier, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
