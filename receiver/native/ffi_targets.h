// The names of the FFI targets, the one place they are written: the module
// hands XLA its handlers under them (module_queues.cc, module_cuda.cc) and
// exports them as OUTFEED_TARGET, CALL_TARGET, ... for the JAX side's
// lowering (receiver/native_library.py), but for the test targets, which
// module_testing.cc hands out. Header only, no state.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_FFI_TARGETS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_FFI_TARGETS_H_

namespace hcb {

inline constexpr char kOutfeedTarget[] = "host_callback_outfeed";
inline constexpr char kCallTarget[] = "host_callback_call";
inline constexpr char kTapSyncTarget[] = "host_callback_tap_sync";
inline constexpr char kBeginTarget[] = "host_callback_begin";
inline constexpr char kEndTarget[] = "host_callback_end";

// Tests only (module_testing.cc): the floors a tap in a scan step cannot go
// below, registered by tools/bench alone.
inline constexpr char kFloorDispatchTarget[] =
    "host_callback_testing_floor_dispatch";
inline constexpr char kFloorPythonTarget[] =
    "host_callback_testing_floor_python";

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_FFI_TARGETS_H_
