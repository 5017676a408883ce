// The XLA FFI handlers that the device runs: they move bytes between device
// buffers and the hub's queues, and never touch Python or the GIL.
//
// Both take and return the ordering token of host_callback's ordered effect,
// so XLA keeps them in program order on each device.

#include <cstdint>
#include <vector>

#include "hub.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The byte spans of the remaining arguments (after the token).
ffi::Error Spans(const ffi::RemainingArgs& args, std::vector<hcb::Span>* out) {
  out->reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out->push_back({buffer->untyped_data(),
                    static_cast<int64_t>(buffer->size_bytes())});
  }
  return ffi::Error::Success();
}

ffi::Error Failed(const hcb::Status& status) {
  return ffi::Error(ffi::ErrorCode::kInternal, status);
}

// A tap: copies the arguments into a packet on the device's queue.
ffi::Error Outfeed(int32_t ordinal, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  std::vector<hcb::Span> arrays;
  if (ffi::Error error = Spans(args, &arrays); error.failure()) return error;
  hcb::Status status = hcb::Hub::Get().Send(ordinal, site, 0, arrays);
  return status.empty() ? ffi::Error::Success() : Failed(status);
}

// A call: sends the arguments as a request packet, then waits for the host's
// reply and writes it into the results (after the token).
ffi::Error Call(int32_t ordinal, ffi::Token, ffi::RemainingArgs args,
                ffi::Result<ffi::Token>, ffi::RemainingRets rets,
                int64_t site) {
  std::vector<hcb::Span> arrays, outputs;
  if (ffi::Error error = Spans(args, &arrays); error.failure()) return error;
  outputs.reserve(rets.size());
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    outputs.push_back({(*buffer)->untyped_data(),
                       static_cast<int64_t>((*buffer)->size_bytes())});
  }
  hcb::Status status = hcb::Hub::Get().Call(ordinal, site, arrays, outputs);
  return status.empty() ? ffi::Error::Success() : Failed(status);
}

}  // namespace

// Exported for ctypes (the library is built with hidden visibility).
#define HCB_HANDLER extern "C" __attribute__((visibility("default")))
HCB_HANDLER XLA_FFI_Error* HcbOutfeed(XLA_FFI_CallFrame* call_frame);
HCB_HANDLER XLA_FFI_Error* HcbCall(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbOutfeed, Outfeed,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Token>()
                                  .RemainingArgs()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbCall, Call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Token>()
                                  .RemainingArgs()
                                  .Ret<ffi::Token>()
                                  .RemainingRets()
                                  .Attr<int64_t>("site"));
