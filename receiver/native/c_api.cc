// The C API that the Python receiver (receiver/transport_native.py) loads
// with ctypes, which releases the GIL around every call.

#include <cstdint>
#include <string>
#include <vector>

#include "hub.h"

#define HCB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
hcb::Hub& hub() { return hcb::Hub::Get(); }
}  // namespace

// Bumped whenever a signature below changes.
HCB_EXPORT int64_t hcb_abi_version() { return 4; }

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

HCB_EXPORT void hcb_release(int64_t device_id, int64_t packets, int64_t bytes) {
  hub().Release(device_id, packets, bytes);
}

// Creates the queue of a device if it has none yet.
HCB_EXPORT void hcb_open_device(int64_t device_id) { hub().Queue(device_id); }

// First releases `released_packets` consumed packets of `released_bytes`
// (they count as finished and leave the queue's bound), then copies the next
// packets into `dst` and `index` (4 int64 per packet: offset, site, request
// id, size); see Hub::Take.
HCB_EXPORT int64_t hcb_take(int64_t device_id, double timeout_s, uint8_t* dst,
                            int64_t capacity, int64_t* index,
                            int64_t max_packets, int64_t released_packets,
                            int64_t released_bytes, int64_t* needed) {
  if (released_packets > 0) {
    hub().Release(device_id, released_packets, released_bytes);
  }
  return hub().Take(device_id, timeout_s, dst, capacity,
                    reinterpret_cast<hcb::IndexEntry*>(index), max_packets,
                    needed);
}

HCB_EXPORT int hcb_wait_finished(int64_t device_id, int64_t target,
                                 double timeout_s) {
  return hub().WaitFinished(device_id, target, timeout_s) ? 1 : 0;
}

// Writes bytes waiting, packets waiting (enqueued, not finished), high-water
// bytes and packets ever enqueued.
HCB_EXPORT void hcb_stats(int64_t device_id, int64_t* out) {
  hcb::DeviceQueue* queue = hub().Queue(device_id);
  std::lock_guard<std::mutex> lock(queue->mu);
  out[0] = queue->bytes;
  out[1] = queue->enqueued - queue->finished;
  out[2] = queue->high_water;
  out[3] = queue->enqueued;
}

// Posts a call's `count` result arrays, `sizes[i]` bytes each, back to back
// in `data`. Returns 0 when delivered, 1 when no device waits for the request
// any more, 2 when the sizes do not match (the device then fails with that
// message).
HCB_EXPORT int hcb_reply(int64_t request_id, int64_t count,
                         const int64_t* sizes, const uint8_t* data) {
  std::vector<hcb::Span> results;
  for (int64_t i = 0, offset = 0; i < count; offset += sizes[i++]) {
    results.push_back({const_cast<uint8_t*>(data + offset), sizes[i]});
  }
  std::string mismatch;
  if (!hub().Reply(request_id, results.data(), results.size(), &mismatch)) {
    return 1;
  }
  return mismatch.empty() ? 0 : 2;
}

// Makes the device waiting for `request_id` fail with `message`. Returns 0
// when delivered, 1 when no device waits for it any more.
HCB_EXPORT int hcb_reply_error(int64_t request_id, const char* message) {
  return hub().ReplyError(request_id, message) ? 0 : 1;
}
