// The CUDA platform's XLA FFI handlers: the device's buffers are GPU memory
// and the stream is the computation's (from the call frame, never a
// global). A tap enqueues the copy of its operands into a pinned block and
// an event, and returns: the packet reaches the queue when the event
// completed (Hub::CudaSend, cuda_copies.h). A call waits for its own
// copy-in, gets the host's answer like a CPU call, and enqueues the copy
// of the results out (Hub::CudaCall). Neither holds the stream while
// Python runs, nor enters Python itself but through the hub's direct run
// of a call. The CUDA runtime's functions come from the CudaApi table
// (cuda_api.h): no CUDA header is needed to build this file.
//
// The handlers run on the thread that enqueues the computation's work on
// its stream; `device_id` is XLA's device ordinal (the local GPU). The
// bindings, spans, site checks and errors are ffi_common.h's; a GPU does
// not count executions (executions.h), so a failure ends none.

#include "ffi_cuda.h"

#include <cstdint>

#include "ffi_common.h"
#include "hub.h"

namespace hcb {
namespace {

// The CUDA handlers' binding starts with the computation's stream.
auto OnStream() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>();
}

// A tap: enqueues the copy of the arguments and the event that lands it.
ffi::Error Outfeed(void* stream, int32_t device_id, ffi::Token,
                   ffi::RemainingArgs args, ffi::Result<ffi::Token>,
                   int64_t site) {
  return HandleSiteArgs(args, site, [&](Spans& arrays) {
    return ToError(Hub::Get().CudaSend(device_id, stream, site, arrays.data(),
                                       arrays.size()));
  }, /*counted=*/false);
}

// A call: the arguments copied in, the host function's answer copied out.
ffi::Error Call(void* stream, int32_t device_id, ffi::Token,
                ffi::RemainingArgs args, ffi::Result<ffi::Token>,
                ffi::RemainingRets rets, int64_t site) {
  return HandleSiteArgs(args, site, [&](Spans& arrays) {
    Spans outputs(rets.size());
    if (ffi::Error error = ResultSpans(rets, &outputs); error.failure()) {
      return error;
    }
    return ToError(Hub::Get().CudaCall(device_id, stream, site, arrays.data(),
                                       arrays.size(), outputs.data(),
                                       outputs.size()));
  }, /*counted=*/false);
}

}  // namespace
}  // namespace hcb

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbCudaOutfeed, hcb::Outfeed,
                              hcb::BindTap(&hcb::OnStream));
XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbCudaCall, hcb::Call,
                              hcb::BindCall(&hcb::OnStream));
