// The C API that the Python receiver (receiver/transport_native.py) loads
// with ctypes, which releases the GIL around every call.
//
// No C++ exception leaves these functions: those that may allocate return
// kOutOfMemory (std::bad_alloc) or kNativeError (any other exception), both
// negative, instead.

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "executions.h"
#include "hub.h"

#define HCB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int64_t kOutOfMemory = -1;
constexpr int64_t kNativeError = -2;

hcb::Hub& hub() { return hcb::Hub::Get(); }

// Returns `body()`, or a negative code when it throws.
template <typename Body>
int64_t Guard(Body body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return kOutOfMemory;
  } catch (...) {
    return kNativeError;
  }
}

}  // namespace

// Bumped whenever a signature below changes.
HCB_EXPORT int64_t hcb_abi_version() { return 7; }

// Writes executions begun, in flight, and the low-water mark of those in
// flight since the last hcb_reset_executions_low_water; see executions.h.
HCB_EXPORT void hcb_executions(int64_t* out) {
  hcb::Executions::Get().Read(out);
}

HCB_EXPORT void hcb_reset_executions_low_water() {
  hcb::Executions::Get().ResetLowWater();
}

// An execution failed in one of our Python callbacks (the Python transport
// on CPU): it ends there.
HCB_EXPORT void hcb_execution_failed() { hcb::Executions::Get().End(); }

HCB_EXPORT void hcb_attach(int64_t max_bytes) { hub().Attach(max_bytes); }

// Returns 1 when packets are left for the next receiver, else 0.
HCB_EXPORT int hcb_detach() { return hub().Detach() ? 1 : 0; }

HCB_EXPORT void hcb_set_restart_hook(hcb::RestartHook hook) {
  hub().SetRestartHook(hook);
}

HCB_EXPORT void hcb_wake_consumers() { hub().WakeConsumers(); }

HCB_EXPORT void hcb_set_direct_runner(hcb::DirectRunner runner) {
  hub().SetDirectRunner(runner);
}

// Devices that wait on the thread `main_thread` (Python's
// `threading.main_thread().ident`) call `hook` to check for Ctrl-C, and
// `rearm` when it reports one; see hcb::InterruptHook.
HCB_EXPORT void hcb_set_interrupt_hook(hcb::InterruptHook hook,
                                       hcb::Rearm rearm,
                                       uint64_t main_thread) {
  hub().SetInterruptHook(hook, rearm, main_thread);
}

// Records that the packets of `site` carry `count` arrays of `bytes[i]`
// bytes each. Returns 0, or a negative code.
HCB_EXPORT int64_t hcb_register_site(int64_t site, int64_t count,
                                     const int64_t* bytes) {
  return Guard([&] {
    hub().RegisterSite(site, std::vector<int64_t>(bytes, bytes + count));
    return int64_t{0};
  });
}

// Frees what `hcb_register_site` recorded. Returns 0, or 1 when the site
// was not registered.
HCB_EXPORT int64_t hcb_unregister_site(int64_t site) {
  return Guard([&] { return hub().UnregisterSite(site) ? int64_t{0} : 1; });
}

// Returns 0, or a negative code.
HCB_EXPORT int64_t hcb_release(int64_t device_id, int64_t packets,
                               int64_t bytes) {
  return Guard([&] {
    hub().Release(device_id, packets, bytes);
    return int64_t{0};
  });
}

// Creates the queue of a device if it has none yet. Returns 0, or a
// negative code.
HCB_EXPORT int64_t hcb_open_device(int64_t device_id) {
  return Guard([&] {
    hub().Queue(device_id);
    return int64_t{0};
  });
}

// First releases `released_packets` consumed packets of `released_bytes`
// (they count as finished and leave the queue's bound), then copies the next
// packets into `dst` and `index` (6 int64 per packet: offset, site, request
// id, size, block, address; a large packet is not copied but lent in its
// block, which the caller gives back with hcb_return_block); see Hub::Take. Returns the number of packets, or a negative code
// (then nothing was taken).
HCB_EXPORT int64_t hcb_take(int64_t device_id, double timeout_s, uint8_t* dst,
                            int64_t capacity, int64_t* index,
                            int64_t max_packets, int64_t released_packets,
                            int64_t released_bytes, int64_t* needed) {
  return Guard([&] {
    if (released_packets > 0) {
      hub().Release(device_id, released_packets, released_bytes);
    }
    return hub().Take(device_id, timeout_s, dst, capacity,
                      reinterpret_cast<hcb::IndexEntry*>(index), max_packets,
                      needed);
  });
}

// Returns 1 when the target was reached, 0 on timeout, or a negative code.
HCB_EXPORT int64_t hcb_wait_finished(int64_t device_id, int64_t target,
                                     double timeout_s) {
  return Guard([&] {
    return hub().WaitFinished(device_id, target, timeout_s) ? int64_t{1} : 0;
  });
}

// Writes bytes waiting, packets waiting (enqueued, not finished), high-water
// bytes and packets ever enqueued. Returns 0, or a negative code.
HCB_EXPORT int64_t hcb_stats(int64_t device_id, int64_t* out) {
  return Guard([&] {
    hcb::DeviceQueue* queue = hub().Queue(device_id);
    std::lock_guard<std::mutex> lock(queue->mu);
    out[0] = queue->bytes;
    out[1] = queue->enqueued - queue->finished;
    out[2] = queue->high_water;
    out[3] = queue->enqueued;
    return int64_t{0};
  });
}

// Gives back a block that hcb_take lent or a direct runner got, once no
// array views it any more.
HCB_EXPORT void hcb_return_block(int64_t block) {
  hub().ReturnBlock(reinterpret_cast<hcb::Block*>(block));
}

// Writes the block pool's free bytes, free blocks, blocks out of the pool
// (queued or lent) and bytes mapped in all. Returns 0.
HCB_EXPORT int64_t hcb_pool_stats(int64_t* out) {
  hub().PoolStats(out);
  return 0;
}

// Posts a call's `count` result arrays, `sizes[i]` bytes each at `data[i]`.
// Returns a hcb::ReplyOutcome: 0 when delivered, 1 when no device
// waits for the request any more, 2 when the sizes do not match (the device
// then fails with a message that says so); or a negative code (then the
// device still waits).
HCB_EXPORT int64_t hcb_reply(int64_t request_id, int64_t count,
                             const int64_t* sizes, void* const* data) {
  return Guard([&] {
    std::vector<hcb::Span> results;
    results.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) results.push_back({data[i], sizes[i]});
    return static_cast<int64_t>(
        hub().Reply(request_id, results.data(), results.size()));
  });
}

// Makes the device waiting for `request_id` fail with `message`. Returns 0
// when delivered, 1 when no device waits for it any more, or a negative code
// (then the device still waits).
HCB_EXPORT int64_t hcb_reply_error(int64_t request_id, const char* message) {
  return Guard([&] {
    return hub().ReplyError(request_id, message) ? int64_t{0} : 1;
  });
}
