// The GIL held for a scope, on any thread.
//
// A thread that Python did not start (XLA's: the worker threads that run an
// asynchronous execution's host functions) has no Python thread state, and
// PyGILState_Ensure alone makes one and its Release frees it, on every
// call: per tap, several times what taking the GIL costs. GilHeld makes
// such a thread's state once and keeps it for the thread's life, as
// pybind11's gil_scoped_acquire can. No Python code runs on a device thread
// after the runtime stopped (the runners and hooks are unset first), so a
// kept state is never used after the interpreter has freed it.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_GIL_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_GIL_H_

#include "python_limited.h"

namespace hcb::python {

class GilHeld {
 public:
  GilHeld() {
    if (PyGILState_GetThisThreadState() == nullptr) KeepThreadState();
    state_ = PyGILState_Ensure();
  }
  ~GilHeld() { PyGILState_Release(state_); }
  GilHeld(const GilHeld&) = delete;
  GilHeld& operator=(const GilHeld&) = delete;

 private:
  // Makes the calling thread's state, whose count then stays at 1, and
  // lets the GIL go again.
  static void KeepThreadState() {
    PyGILState_Ensure();
    PyEval_SaveThread();
  }

  PyGILState_STATE state_;
};

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_GIL_H_
