// The CPU's XLA FFI handlers of host_callback's targets (ffi_cpu.cc), which
// the extension module hands to JAX as PyCapsules (module_queues.cc).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_FFI_CPU_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_FFI_CPU_H_

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HcbOutfeed(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HcbCall(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HcbTapSync(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HcbBegin(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HcbEnd(XLA_FFI_CallFrame* call_frame);
}

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_FFI_CPU_H_
