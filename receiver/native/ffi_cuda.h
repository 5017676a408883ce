// The CUDA platform's XLA FFI handlers of host_callback's tap and call
// targets (ffi_cuda.cc), which the extension module hands to JAX as
// PyCapsules (module_cuda.cc) for registration on the "CUDA" platform, only when
// JAX has a CUDA backend. A GPU has no synchronous taps (its taps are
// always in the outfeed mode) and does not count executions (begin, end:
// CPU only, host_callback/executions.py).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_FFI_CUDA_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_FFI_CUDA_H_

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HcbCudaOutfeed(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HcbCudaCall(XLA_FFI_CallFrame* call_frame);
}

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_FFI_CUDA_H_
