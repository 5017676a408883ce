// What every platform's XLA FFI handlers share: the bindings (the token, the
// arrays, the `site` attribute, the device ordinal), reading the byte spans
// of the call frame's buffers, checking them against the site, and turning
// a Status or a C++ exception into an ffi::Error. The CPU's handlers are in
// ffi_cpu.cc; another platform's go beside them and add only what differs
// (where the bytes are, the stream).
//
// Called on the device's thread, inside a handler; no state of its own.
// The hot helpers are inline: a handler runs them for every packet.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_FFI_COMMON_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_FFI_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "executions.h"
#include "hub.h"
#include "packet.h"
#include "status.h"
#include "xla/ffi/api/ffi.h"

namespace hcb {

namespace ffi = xla::ffi;

// The binding of every platform's handlers starts with `start()`:
// ffi::Ffi::Bind(), or that and the platform's stream.
inline auto BindNothing() { return ffi::Ffi::Bind(); }

// What every op of a site takes, after what `start()` binds: the device
// ordinal, then (token, *args) and the result token.
template <typename Start>
auto BindSiteOp(Start start) {
  return start()
      .template Ctx<ffi::DeviceOrdinal>()
      .template Arg<ffi::Token>()
      .RemainingArgs()
      .template Ret<ffi::Token>();
}

// A tap and a synchronous tap: (token, *args) -> token, attribute `site`;
// handlers take what `start()` binds, then (device ordinal, token, args,
// result token, site).
template <typename Start = decltype(&BindNothing)>
auto BindTap(Start start = &BindNothing) {
  return BindSiteOp(start).template Attr<int64_t>("site");
}

// A call: (token, *args) -> (token, *results), attribute `site`; handlers
// take what `start()` binds, then (device ordinal, token, args, result
// token, results, site).
template <typename Start = decltype(&BindNothing)>
auto BindCall(Start start = &BindNothing) {
  return BindSiteOp(start).RemainingRets().template Attr<int64_t>("site");
}

// Our ordering token alone (host_callback_begin).
inline auto BindToken() {
  return ffi::Ffi::Bind().Arg<ffi::Token>().Ret<ffi::Token>();
}

// Our ordering token and arrays left unread (host_callback_end).
inline auto BindTokenKeeping() {
  return ffi::Ffi::Bind().Arg<ffi::Token>().RemainingArgs().Ret<ffi::Token>();
}

// The byte spans of some buffers, without allocating for the usual few.
class Spans {
 public:
  explicit Spans(size_t size) : size_(size) {
    if (size > kInline) heap_.resize(size);
  }
  Span* data() { return size_ > kInline ? heap_.data() : inline_; }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kInline = 8;
  size_t size_;
  Span inline_[kInline];
  std::vector<Span> heap_;
};

// The dtypes XLA packs below a byte: each with its bits per element and its
// NumPy (ml_dtypes) name, which the module exports as PACKED_BITS for the
// Python side's rule (native_wire.packed_bits) to be checked against.
struct PackedDtype {
  ffi::DataType dtype;
  int bits;
  const char* numpy_name;
};
inline constexpr PackedDtype kPackedDtypes[] = {
    {ffi::DataType::S1, 1, "int1"},   {ffi::DataType::U1, 1, "uint1"},
    {ffi::DataType::S2, 2, "int2"},   {ffi::DataType::U2, 2, "uint2"},
    {ffi::DataType::S4, 4, "int4"},   {ffi::DataType::U4, 4, "uint4"},
    {ffi::DataType::F4E2M1FN, 4, "float4_e2m1fn"},
};

// Bits per element of the dtypes XLA packs below a byte; 0 for the others.
inline int PackedBits(ffi::DataType dtype) {
  for (const PackedDtype& packed : kPackedDtypes) {
    if (packed.dtype == dtype) return packed.bits;
  }
  return 0;
}

// The buffer's bytes as XLA stores them (AnyBuffer::size_bytes() counts a
// byte per element even for the packed sub-byte dtypes), at the buffer's
// address in the platform's memory.
inline Span SpanOf(const ffi::AnyBuffer& buffer) {
  const int bits = PackedBits(buffer.element_type());
  const size_t bytes = bits == 0
                           ? buffer.size_bytes()
                           : (buffer.element_count() * bits + 7) / 8;
  return {buffer.untyped_data(), static_cast<int64_t>(bytes)};
}

// An error that fails the computation with `status`; see ToError.
ffi::Error StatusError(const Status& status);

inline ffi::Error ToError(const Status& status) {
  return status.ok() ? ffi::Error::Success() : StatusError(status);
}

// The spans of the arguments, checked against what `site` expects.
inline ffi::Error SiteArgs(const ffi::RemainingArgs& args, int64_t site,
                           Spans* spans) {
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    spans->data()[i] = SpanOf(*buffer);
  }
  return ToError(Hub::Get().sites().Check(site, spans->data(), spans->size()));
}

// The spans of the results.
inline ffi::Error ResultSpans(const ffi::RemainingRets& rets, Spans* spans) {
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    spans->data()[i] = SpanOf(**buffer);
  }
  return ffi::Error::Success();
}

// The error for the C++ exception being handled (in a catch block):
// bad_alloc is RESOURCE_EXHAUSTED, any other INTERNAL.
ffi::Error CurrentExceptionError() noexcept;

// Returns `body()`; a C++ exception fails the computation instead.
template <typename Body>
ffi::Error Guard(Body body) noexcept {
  try {
    return body();
  } catch (...) {
    return CurrentExceptionError();
  }
}

// The execution stops at a failing op: it ends there (executions.h).
inline ffi::Error EndOnFailure(ffi::Error error) {
  if (error.failure()) Executions::Get().End();
  return error;
}

// The body of every handler of a site: reads the arguments' spans, checks
// them against `site`, then returns `deliver(arrays)` (an ffi::Error). A
// C++ exception fails the computation instead, and where executions are
// counted (`counted`: on CPU, see executions.h) a failure ends the
// execution.
template <typename Deliver>
ffi::Error HandleSiteArgs(const ffi::RemainingArgs& args, int64_t site,
                          Deliver deliver, bool counted = true) noexcept {
  ffi::Error outcome = Guard([&] {
    Spans arrays(args.size());
    if (ffi::Error error = SiteArgs(args, site, &arrays); error.failure()) {
      return error;
    }
    return deliver(arrays);
  });
  return counted ? EndOnFailure(std::move(outcome)) : outcome;
}

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_FFI_COMMON_H_
