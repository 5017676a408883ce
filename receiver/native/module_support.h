// What the extension module's parts share: module.cc adds the method
// tables of the parts (module_queues.cc, module_cuda.cc,
// module_testing.cc, python_hooks.cc, idle_check.cc, python_instances.cc,
// python_consume.cc), whose functions run C++ with its exceptions turned
// into Python's (CatchToPython), release the GIL while they wait or copy
// much (WithoutGil), and parse lists of ints and spans.
//
// C++ exceptions become Python exceptions: std::bad_alloc a MemoryError,
// any other a RuntimeError.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_MODULE_SUPPORT_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_MODULE_SUPPORT_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "hub.h"
#include "packet.h"
#include "status.h"
#include "xla/ffi/api/c_api.h"

namespace hcb::python {

inline Hub& hub() { return Hub::Get(); }

// Runs `body()`, which returns a new reference; a C++ exception becomes a
// Python exception.
template <typename Body>
PyObject* CatchToPython(Body body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError,
                    (std::string("host_callback native: ") + error.what())
                        .c_str());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError,
                    "host_callback native: an unknown C++ exception");
  }
  return nullptr;
}

// Runs `body()` with the GIL released; its C++ exception is rethrown once
// the GIL is back.
template <typename Body>
void WithoutGil(Body body) {
  std::exception_ptr failure;
  Py_BEGIN_ALLOW_THREADS
  try {
    body();
  } catch (...) {
    failure = std::current_exception();
  }
  Py_END_ALLOW_THREADS
  if (failure) std::rethrow_exception(failure);
}

// A list of Python ints as int64s; false with an exception set.
bool Int64s(PyObject* list, std::vector<int64_t>* out);

// A sequence of (address, bytes) pairs as spans; false with an exception.
bool SpanList(PyObject* list, std::vector<Span>* out);

// Raises RuntimeError with `status`'s message unless it is ok.
PyObject* NoneOrRaise(const Status& status);

// An FFI handler as the PyCapsule jax.ffi.register_ffi_target takes.
PyObject* Capsule(XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*));

// The parts' module functions, each table ending with an empty entry.
extern PyMethodDef kQueueMethods[];    // module_queues.cc
extern PyMethodDef kCudaMethods[];     // module_cuda.cc
extern PyMethodDef kTestingMethods[];  // module_testing.cc
extern PyMethodDef kHookMethods[];     // python_hooks.cc
extern PyMethodDef kIdleCheckMethods[];  // idle_check.cc
extern PyMethodDef kInstanceMethods[];  // python_instances.cc
extern PyMethodDef kConsumeMethods[];  // python_consume.cc
extern PyMethodDef kPlainTapMethods[];  // python_plain_tap.cc

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_MODULE_SUPPORT_H_
