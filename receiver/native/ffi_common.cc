// What every platform's FFI handlers share: see ffi_common.h.

#include "ffi_common.h"

#include <exception>
#include <new>
#include <string>

namespace hcb {

namespace {

constexpr bool Same(Code ours, ffi::ErrorCode xla) {
  return static_cast<int>(ours) == static_cast<int>(xla);
}

}  // namespace

// Code uses XLA's numbers for the codes it has.
static_assert(Same(Code::kCancelled, ffi::ErrorCode::kCancelled) &&
              Same(Code::kInvalidArgument, ffi::ErrorCode::kInvalidArgument) &&
              Same(Code::kNotFound, ffi::ErrorCode::kNotFound) &&
              Same(Code::kFailedPrecondition,
                   ffi::ErrorCode::kFailedPrecondition) &&
              Same(Code::kResourceExhausted,
                   ffi::ErrorCode::kResourceExhausted) &&
              Same(Code::kInternal, ffi::ErrorCode::kInternal) &&
              Same(Code::kUnavailable, ffi::ErrorCode::kUnavailable));

ffi::Error StatusError(const Status& status) {
  return ffi::Error(static_cast<ffi::ErrorCode>(status.code), status.message);
}

ffi::Error CurrentExceptionError() noexcept {
  try {
    throw;
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

}  // namespace hcb
