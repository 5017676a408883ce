// The CPU's XLA FFI handlers: the device's buffers are host memory, used as
// they are; a tap copies them into a packet on the device's queue, a request
// hands them to the hub's direct run or queues them (Hub::Send, Hub::Call).
// Only a direct run (python_runner.cc) enters Python. What another platform
// would share with these (bindings, spans, site checks, errors) is in
// ffi_common.h.
//
// Each runs on the thread that executes the device's computation. All take
// and return host_callback's ordering token, so XLA keeps them in program
// order on each device. `device_id` is XLA's device ordinal, which on CPU
// is the jax.Device.id of the executing device. No C++ exception leaves a
// handler: it fails the computation with an ffi::Error instead.
//
// host_callback_begin and host_callback_end open and close each execution of
// our computations on each device (see executions.h); a handler that fails
// its execution counts it as ended. host_callback_end may take arrays it
// does not read (see End).

#include "ffi_cpu.h"

#include <cstdint>

#include "executions.h"
#include "ffi_common.h"
#include "huge_pages.h"
#include "hub.h"

namespace hcb {
namespace {

ffi::Error Begin(ffi::Token, ffi::Result<ffi::Token>) {
  Executions::Get().Begin();
  return ffi::Error::Success();
}

// `kept` are the computation's result, read by nothing: being an operand
// here keeps XLA's CPU library fusion from fusing the ROOT into one of its
// other users (host_callback/primitive/ordering.py, docs/xla_root_fusion.md).
ffi::Error End(ffi::Token, ffi::RemainingArgs kept, ffi::Result<ffi::Token>) {
  static_cast<void>(kept);
  Executions::Get().End();
  return ffi::Error::Success();
}

// A tap: copies the arguments into a packet on the device's queue.
ffi::Error Outfeed(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  return HandleSiteArgs(args, site, [&](Spans& arrays) {
    return ToError(
        Hub::Get().Send(device_id, site, arrays.data(), arrays.size()));
  });
}

// A call: runs the host function on the arguments, or sends them as a
// request packet and waits for the host's reply; either writes the results
// (after the token), into buffers advised huge pages (huge_pages.h).
ffi::Error Call(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                ffi::Result<ffi::Token>, ffi::RemainingRets rets,
                int64_t site) {
  return HandleSiteArgs(args, site, [&](Spans& arrays) {
    Spans outputs(rets.size());
    if (ffi::Error error = ResultSpans(rets, &outputs); error.failure()) {
      return error;
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Span& output = outputs.data()[i];
      AdviseHugePages(output.data, static_cast<size_t>(output.bytes));
    }
    return ToError(Hub::Get().Call(device_id, site, arrays.data(),
                                   arrays.size(), outputs.data(),
                                   outputs.size()));
  });
}

// A synchronous tap: a request without results, which returns once the host
// function did. It returns only the token: the tap's outputs are its
// operands, which XLA passes on untouched (no copy), and the token orders it
// with our later ops.
ffi::Error TapSync(int32_t device_id, ffi::Token, ffi::RemainingArgs args,
                   ffi::Result<ffi::Token>, int64_t site) {
  return HandleSiteArgs(args, site, [&](Spans& arrays) {
    return ToError(Hub::Get().Call(device_id, site, arrays.data(),
                                   arrays.size(), nullptr, 0));
  });
}

}  // namespace
}  // namespace hcb

XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbBegin, hcb::Begin, hcb::BindToken());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbEnd, hcb::End, hcb::BindTokenKeeping());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbOutfeed, hcb::Outfeed, hcb::BindTap());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbCall, hcb::Call, hcb::BindCall());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HcbTapSync, hcb::TapSync, hcb::BindTap());
