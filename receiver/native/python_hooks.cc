// Hooks into Python, called by device threads: see python_hooks.h.

#include "python_hooks.h"

#include <cstdint>

#include "hub.h"
#include "module_support.h"
#include "python_gil.h"
#include "python_limited.h"
#include "python_runner.h"

namespace hcb::python {
namespace {

PyObject* restart_callable = nullptr;  // owned; guarded by the GIL

// The RestartHook (receiver_link.h): calls Python's restart function.
int Restart() {
  GilHeld gil;
  int failed = 1;
  if (restart_callable != nullptr) {
    PyObject* result = PyObject_CallNoArgs(restart_callable);
    failed = result == nullptr;
    Py_XDECREF(result);
    if (failed) PyErr_Clear();  // the device fails: "cannot start again"
  }
  return failed;
}

PyObject* nested_callable = nullptr;  // owned; guarded by the GIL

// The NestedConsumer (direct_runs.h): calls Python's nested consumer.
int ConsumeNested(int64_t device_id) {
  GilHeld gil;
  int failed = 1;
  if (nested_callable != nullptr) {
    PyObject* result = PyObject_CallFunction(nested_callable, "L",
                                             static_cast<long long>(device_id));
    failed = result == nullptr;
    Py_XDECREF(result);
    if (failed) {
      PyErr_WriteUnraisable(nested_callable);  // logged; the device fails
    }
  }
  return failed;
}

// The InterruptHook (interrupts.h): Python's PyOS_InterruptOccurred, which
// on the main thread reports (and clears) a pending Ctrl-C without running
// Python code.
int InterruptOccurred() {
  GilHeld gil;
  return PyOS_InterruptOccurred();
}

// The Rearm hook (interrupts.h), callable without the GIL.
void Rearm() { PyErr_SetInterrupt(); }

// Keeps `callable` in `*slot` and hands `set` the `hook`, which calls it;
// or, for None, hands `set` no hook and drops the callable.
template <typename Hook, typename Set>
PyObject* SetPythonHook(PyObject* callable, PyObject** slot, Hook hook,
                        Set set) {
  if (callable == Py_None) {
    set(nullptr);
    Py_CLEAR(*slot);
  } else {
    Py_INCREF(callable);
    Replace(slot, callable);
    set(hook);
  }
  Py_RETURN_NONE;
}

}  // namespace

PyObject* SetRestartHook(PyObject*, PyObject* callable) {
  return SetPythonHook(callable, &restart_callable, Restart,
                       [](RestartHook hook) {
                         Hub::Get().SetRestartHook(hook);
                       });
}

PyObject* SetNestedConsumer(PyObject*, PyObject* callable) {
  return SetPythonHook(callable, &nested_callable, ConsumeNested,
                       [](NestedConsumer consumer) {
                         Hub::Get().direct_runs().set_nested_consumer(consumer);
                       });
}

PyObject* SetDirectRunner(PyObject*, PyObject* args) {
  PyObject *runner, *wire, *device_buffer;
  PyObject *consumers = Py_None, *failed = Py_None, *failed_queued = Py_None,
           *run_slots = Py_None;
  if (!PyArg_ParseTuple(args, "OOO|OOOO", &runner, &wire, &device_buffer,
                        &consumers, &failed, &failed_queued, &run_slots)) {
    return nullptr;
  }
  if (consumers != Py_None && !PyDict_Check(consumers)) {
    PyErr_SetString(PyExc_TypeError, "consumers: a dict");
    return nullptr;
  }
  DirectRuns& direct_runs = Hub::Get().direct_runs();
  if (runner == Py_None || wire == Py_None || device_buffer == Py_None) {
    direct_runs.set_runner(nullptr);
    direct_runs.set_guest_consumer(nullptr);
    SetRunner(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  } else {
    const bool calls_consumers = consumers != Py_None && failed != Py_None &&
                                 failed_queued != Py_None &&
                                 run_slots != Py_None;
    auto given = [](PyObject* object) {
      return object == Py_None ? nullptr : object;
    };
    SetRunner(runner, wire, device_buffer, given(consumers), given(failed),
              given(failed_queued), given(run_slots));
    direct_runs.set_runner(Run);
    direct_runs.set_guest_consumer(calls_consumers ? RunWaitingTaps : nullptr);
  }
  Py_RETURN_NONE;
}

PyObject* CloseDirectRuns(PyObject*, PyObject*) {
  StopCallingConsumers();
  Py_RETURN_NONE;
}

PyObject* RunsHostFunctionOnThisThread(PyObject*, PyObject*) {
  return PyBool_FromLong(RunsHostFunctionHere());
}

PyObject* SetInterruptThread(PyObject*, PyObject* args) {
  unsigned long long main_thread;
  if (!PyArg_ParseTuple(args, "K", &main_thread)) return nullptr;
  if (main_thread == 0) {
    Hub::Get().interrupts().Set(nullptr, nullptr, 0);
  } else {
    Hub::Get().interrupts().Set(InterruptOccurred, Rearm, main_thread);
  }
  Py_RETURN_NONE;
}

PyObject* CtrlCCancellations(PyObject*, PyObject*) {
  return PyLong_FromLongLong(Hub::Get().interrupts().cancellations());
}

// `call_clearing_ctrl_c(function, *args)`: takes a pending Ctrl-C (on the
// main thread), then returns `function(ctrl_c_was_pending, *args)`. A C
// function, so no Python code runs (where Python would raise the pending
// KeyboardInterrupt) before `function` knows.
PyObject* CallClearingCtrlC(PyObject*, PyObject* args) {
  const Py_ssize_t count = PyTuple_Size(args);
  if (count < 1) {
    PyErr_SetString(PyExc_TypeError, "call_clearing_ctrl_c(function, *args)");
    return nullptr;
  }
  const bool pending = PyOS_InterruptOccurred() != 0;
  PyObject* call_args = PyTuple_New(count);
  if (call_args == nullptr) return nullptr;
  PyTuple_SetItem(call_args, 0, PyBool_FromLong(pending));
  for (Py_ssize_t i = 1; i < count; ++i) {
    PyObject* item = PyTuple_GetItem(args, i);
    Py_INCREF(item);
    PyTuple_SetItem(call_args, i, item);
  }
  PyObject* result = PyObject_Call(PyTuple_GetItem(args, 0), call_args, nullptr);
  Py_DECREF(call_args);
  return result;
}

PyMethodDef kHookMethods[] = {
    {"set_restart_hook", SetRestartHook, METH_O, nullptr},
    {"set_nested_consumer", SetNestedConsumer, METH_O, nullptr},
    {"set_direct_runner", SetDirectRunner, METH_VARARGS, nullptr},
    {"close_direct_runs", CloseDirectRuns, METH_NOARGS, nullptr},
    {"set_interrupt_thread", SetInterruptThread, METH_VARARGS, nullptr},
    {"runs_host_function_here", RunsHostFunctionOnThisThread, METH_NOARGS, nullptr},
    {"ctrl_c_cancellations", CtrlCCancellations, METH_NOARGS, nullptr},
    {"call_clearing_ctrl_c", CallClearingCtrlC, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
