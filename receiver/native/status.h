// Status: the outcome of an operation of the native core, with a canonical
// (absl) code as XLA's FFI numbers them (ffi_common.cc checks that they
// agree and turns a Status into an ffi::Error). Header only; used by every
// part, on any thread.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_STATUS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_STATUS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace hcb {

// Why an operation failed.
enum class Code : uint8_t {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kNotFound = 5,
  kFailedPrecondition = 9,
  kResourceExhausted = 8,
  kInternal = 13,
  kUnavailable = 14,
};

struct Status {
  Code code = Code::kOk;
  std::string message;

  bool ok() const { return code == Code::kOk; }
};

inline Status Failure(Code code, std::string message) {
  return Status{code, std::move(message)};
}

// "[b0, b1, ...]" for `count` byte sizes, `bytes(i)` each: for messages.
template <typename Bytes>
std::string ByteSizes(size_t count, Bytes bytes) {
  std::string text = "[";
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(bytes(i));
  }
  return text + "]";
}

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_STATUS_H_
