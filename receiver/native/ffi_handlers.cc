// The XLA FFI handlers that the device runs: they move bytes between device
// buffers and the hub's queues, and never touch Python or the GIL.
//
// Both take and return host_callback's ordering token, so XLA keeps them in
// program order on each device. `device_id` is XLA's device ordinal, which on
// CPU is the jax.Device.id of the executing device.

#include <cstdint>
#include <vector>

#include "hub.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The byte spans of some buffers, without allocating for the usual few.
class Spans {
 public:
  explicit Spans(size_t size) : size_(size) {
    if (size > kInline) heap_.resize(size);
  }
  hcb::Span* data() { return size_ > kInline ? heap_.data() : inline_; }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kInline = 8;
  size_t size_;
  hcb::Span inline_[kInline];
  std::vector<hcb::Span> heap_;
};

hcb::Span SpanOf(const ffi::AnyBuffer& buffer) {
  return {buffer.untyped_data(), static_cast<int64_t>(buffer.size_bytes())};
}

ffi::Error ArgSpans(const ffi::RemainingArgs& args, Spans* spans) {
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    spans->data()[i] = SpanOf(*buffer);
  }
  return ffi::Error::Success();
}

ffi::Error Done(const hcb::Status& status) {
  return status.empty() ? ffi::Error::Success()
                        : ffi::Error(ffi::ErrorCode::kInternal, status);
}

// A tap: copies the arguments into a packet on the device's queue.
ffi::Error Outfeed(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  Spans arrays(args.size());
  if (ffi::Error error = ArgSpans(args, &arrays); error.failure()) return error;
  return Done(hcb::Hub::Get().Send(device_id, site, /*request_id=*/0,
                                   arrays.data(), arrays.size()));
}

// A call: sends the arguments as a request packet, then waits for the host's
// reply and writes it into the results (after the token).
ffi::Error Call(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                ffi::Result<ffi::Token>, ffi::RemainingRets rets,
                int64_t site) {
  Spans arrays(args.size()), outputs(rets.size());
  if (ffi::Error error = ArgSpans(args, &arrays); error.failure()) return error;
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    outputs.data()[i] = SpanOf(**buffer);
  }
  return Done(hcb::Hub::Get().Call(device_id, site, arrays.data(), arrays.size(),
                                   outputs.data(), outputs.size()));
}

// A synchronous tap: sends the first `num_sent` arguments as a request, then
// waits for the host function to return. The results alias the arguments
// (XLA passes them through), so the tap's outputs come after its function.
ffi::Error TapSync(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, ffi::RemainingRets, int64_t site,
                   int64_t num_sent) {
  if (num_sent < 0 || static_cast<size_t>(num_sent) > args.size()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "host_callback: num_sent is out of range");
  }
  Spans arrays(static_cast<size_t>(num_sent));
  for (size_t i = 0; i < arrays.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    arrays.data()[i] = SpanOf(*buffer);
  }
  return Done(hcb::Hub::Get().Call(device_id, site, arrays.data(),
                                   arrays.size(), nullptr, 0));
}

}  // namespace

// Exported for ctypes (the library is built with hidden visibility).
#define HCB_HANDLER extern "C" __attribute__((visibility("default")))
HCB_HANDLER XLA_FFI_Error* HcbOutfeed(XLA_FFI_CallFrame* call_frame);
HCB_HANDLER XLA_FFI_Error* HcbCall(XLA_FFI_CallFrame* call_frame);
HCB_HANDLER XLA_FFI_Error* HcbTapSync(XLA_FFI_CallFrame* call_frame);

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbTapSync, TapSync,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::Token>()
                                  .RemainingArgs()
                                  .Ret<ffi::Token>()
                                  .RemainingRets()
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("num_sent"));
