// The XLA FFI handlers that the device runs: they move bytes between device
// buffers and the hub's queues. Only a direct run (Hub::Call, see
// python_runner.cc) enters Python.
//
// Both take and return host_callback's ordering token, so XLA keeps them in
// program order on each device. `device_id` is XLA's device ordinal, which on
// CPU is the jax.Device.id of the executing device. No C++ exception leaves
// a handler: it fails the computation with an ffi::Error instead.
//
// host_callback_begin and host_callback_end open and close each execution of
// our computations on each device (see executions.h); a handler that fails
// its execution counts it as ended.

#include <cstdint>
#include <exception>
#include <new>
#include <vector>

#include "ffi_handlers.h"

#include "executions.h"
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

// Bits per element of the dtypes XLA packs below a byte; 0 for the others.
int PackedBits(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::DataType::S1:
    case ffi::DataType::U1:
      return 1;
    case ffi::DataType::S2:
    case ffi::DataType::U2:
      return 2;
    case ffi::DataType::S4:
    case ffi::DataType::U4:
    case ffi::DataType::F4E2M1FN:
      return 4;
    default:
      return 0;
  }
}

// The buffer's bytes as XLA stores them: AnyBuffer::size_bytes() counts a
// byte per element even for the packed sub-byte dtypes.
hcb::Span SpanOf(const ffi::AnyBuffer& buffer) {
  const int bits = PackedBits(buffer.element_type());
  const size_t bytes = bits == 0
                           ? buffer.size_bytes()
                           : (buffer.element_count() * bits + 7) / 8;
  return {buffer.untyped_data(), static_cast<int64_t>(bytes)};
}

ffi::Error ArgSpans(const ffi::RemainingArgs& args, Spans* spans) {
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    spans->data()[i] = SpanOf(*buffer);
  }
  return ffi::Error::Success();
}

// hcb::Code uses XLA's numbers for the codes it has.
static_assert(static_cast<int>(hcb::Code::kCancelled) ==
              static_cast<int>(ffi::ErrorCode::kCancelled));
static_assert(static_cast<int>(hcb::Code::kInvalidArgument) ==
              static_cast<int>(ffi::ErrorCode::kInvalidArgument));
static_assert(static_cast<int>(hcb::Code::kNotFound) ==
              static_cast<int>(ffi::ErrorCode::kNotFound));
static_assert(static_cast<int>(hcb::Code::kFailedPrecondition) ==
              static_cast<int>(ffi::ErrorCode::kFailedPrecondition));
static_assert(static_cast<int>(hcb::Code::kResourceExhausted) ==
              static_cast<int>(ffi::ErrorCode::kResourceExhausted));
static_assert(static_cast<int>(hcb::Code::kInternal) ==
              static_cast<int>(ffi::ErrorCode::kInternal));
static_assert(static_cast<int>(hcb::Code::kUnavailable) ==
              static_cast<int>(ffi::ErrorCode::kUnavailable));

ffi::Error Done(const hcb::Status& status) {
  return status.ok() ? ffi::Error::Success()
                     : ffi::Error(static_cast<ffi::ErrorCode>(status.code),
                                  status.message);
}

// Returns `body()`; a C++ exception fails the computation instead.
template <typename Body>
ffi::Error Guard(Body body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "host_callback: out of host memory for a callback's "
                      "arrays");
  } catch (const std::exception& error) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("host_callback: ") + error.what());
  } catch (...) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "host_callback: an unknown C++ exception");
  }
}

// The execution stops at a failing op: it ends there.
ffi::Error EndOnFailure(ffi::Error error) {
  if (error.failure()) hcb::Executions::Get().End();
  return error;
}

ffi::Error Begin(ffi::Token, ffi::Result<ffi::Token>) {
  hcb::Executions::Get().Begin();
  return ffi::Error::Success();
}

ffi::Error End(ffi::Token, ffi::Result<ffi::Token>) {
  hcb::Executions::Get().End();
  return ffi::Error::Success();
}

// A tap: copies the arguments into a packet on the device's queue.
ffi::Error Outfeed(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  return EndOnFailure(Guard([&] {
    Spans arrays(args.size());
    if (ffi::Error error = ArgSpans(args, &arrays); error.failure()) {
      return error;
    }
    return Done(hcb::Hub::Get().Send(device_id, site, /*request_id=*/0,
                                     arrays.data(), arrays.size()));
  }));
}

// A call: sends the arguments as a request packet, then waits for the host's
// reply and writes it into the results (after the token).
ffi::Error Call(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                ffi::Result<ffi::Token>, ffi::RemainingRets rets,
                int64_t site) {
  return EndOnFailure(Guard([&] {
    Spans arrays(args.size()), outputs(rets.size());
    if (ffi::Error error = ArgSpans(args, &arrays); error.failure()) {
      return error;
    }
    for (size_t i = 0; i < rets.size(); ++i) {
      auto buffer = rets.get<ffi::AnyBuffer>(i);
      if (buffer.has_error()) return buffer.error();
      outputs.data()[i] = SpanOf(**buffer);
    }
    return Done(hcb::Hub::Get().Call(device_id, site, arrays.data(),
                                     arrays.size(), outputs.data(),
                                     outputs.size()));
  }));
}

// A synchronous tap: sends the arguments as a request, then waits for the
// host function to return. It returns only the token: the tap's outputs are
// its operands, which XLA passes on untouched (no copy), and the token orders
// it with our later ops.
ffi::Error TapSync(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  return EndOnFailure(Guard([&] {
    Spans arrays(args.size());
    if (ffi::Error error = ArgSpans(args, &arrays); error.failure()) {
      return error;
    }
    return Done(hcb::Hub::Get().Call(device_id, site, arrays.data(),
                                     arrays.size(), nullptr, 0));
  }));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbBegin, Begin,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbEnd, End,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>());

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
                                  .Attr<int64_t>("site"));
