// The hooks through which device threads call into Python (the restart
// hook, the nested consumer, the interrupt hook, the direct runner, which
// also runs the taps waiting before a request), and the module functions
// that set them (set_restart_hook, set_nested_consumer,
// set_interrupt_thread, set_direct_runner, in kHookMethods; receiver/
// transport_native.py calls them), runs_host_function_here, which
// receiver/consumer_threads.py asks, and ctrl_c_cancellations and
// call_clearing_ctrl_c, for receiver/ctrl_c.py.
//
// The module functions run with the GIL, which guards the Python callables
// they keep; the hooks take the GIL themselves (Rearm needs none).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_HOOKS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_HOOKS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hcb::python {

PyObject* SetRestartHook(PyObject* module, PyObject* callable);
PyObject* SetNestedConsumer(PyObject* module, PyObject* callable);
PyObject* SetDirectRunner(PyObject* module, PyObject* args);
PyObject* SetInterruptThread(PyObject* module, PyObject* args);
// `runs_host_function_here()`: whether the calling thread runs a direct
// run's host function now (python_runner.h:RunsHostFunctionHere).
PyObject* RunsHostFunctionOnThisThread(PyObject* module, PyObject* unused);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_HOOKS_H_
