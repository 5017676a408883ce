// What every platform's FFI handlers share: see ffi_common.h.

#include "ffi_common.h"

#include <exception>
#include <new>
#include <string>

namespace hcb {

// Code uses XLA's numbers for the codes it has.
static_assert(static_cast<int>(Code::kCancelled) ==
              static_cast<int>(ffi::ErrorCode::kCancelled));
static_assert(static_cast<int>(Code::kInvalidArgument) ==
              static_cast<int>(ffi::ErrorCode::kInvalidArgument));
static_assert(static_cast<int>(Code::kNotFound) ==
              static_cast<int>(ffi::ErrorCode::kNotFound));
static_assert(static_cast<int>(Code::kFailedPrecondition) ==
              static_cast<int>(ffi::ErrorCode::kFailedPrecondition));
static_assert(static_cast<int>(Code::kResourceExhausted) ==
              static_cast<int>(ffi::ErrorCode::kResourceExhausted));
static_assert(static_cast<int>(Code::kInternal) ==
              static_cast<int>(ffi::ErrorCode::kInternal));
static_assert(static_cast<int>(Code::kUnavailable) ==
              static_cast<int>(ffi::ErrorCode::kUnavailable));

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
