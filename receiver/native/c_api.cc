// The C API that the Python receiver (receiver/transport_native.py) loads
// with ctypes, which releases the GIL around every call.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hub.h"

#define HCB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
hcb::Hub& hub() { return hcb::Hub::Get(); }
}  // namespace

// Bumped whenever a signature below changes.
HCB_EXPORT int64_t hcb_abi_version() { return 1; }

HCB_EXPORT void hcb_attach(int64_t max_bytes) { hub().Attach(max_bytes); }

HCB_EXPORT void hcb_stop() { hub().Stop(); }

// Creates the queue of a device; returns 1 if it did not exist.
HCB_EXPORT int hcb_open_device(int64_t ordinal) {
  bool created = false;
  hub().Queue(ordinal, &created);
  return created ? 1 : 0;
}

// Writes up to `capacity` device ordinals that have a queue; returns how many
// there are.
HCB_EXPORT int64_t hcb_ordinals(int64_t* out, int64_t capacity) {
  std::vector<int64_t> ordinals = hub().Ordinals();
  for (int64_t i = 0; i < capacity && i < static_cast<int64_t>(ordinals.size());
       ++i) {
    out[i] = ordinals[i];
  }
  return static_cast<int64_t>(ordinals.size());
}

// Takes a batch of packets (see Hub::Take). Returns an opaque batch to pass
// to hcb_copy_batch, or null; sets its packet count and total bytes.
HCB_EXPORT void* hcb_take(int64_t ordinal, double timeout_s, int64_t max_bytes,
                          int64_t* count, int64_t* bytes) {
  std::unique_ptr<hcb::Batch> batch = hub().Take(ordinal, timeout_s, max_bytes);
  if (batch == nullptr) return nullptr;
  *count = static_cast<int64_t>(batch->packets.size());
  *bytes = batch->bytes;
  return batch.release();
}

// Copies a batch into `dst` (its total bytes long) and `index` (4 int64 per
// packet: offset, site, request id, size), then frees it. Returns the number
// of packets written.
HCB_EXPORT int64_t hcb_copy_batch(void* batch, uint8_t* dst, int64_t* index) {
  std::unique_ptr<hcb::Batch> owned(static_cast<hcb::Batch*>(batch));
  return hub().CopyBatch(*owned, dst,
                         reinterpret_cast<hcb::IndexEntry*>(index));
}

HCB_EXPORT void hcb_release(int64_t ordinal, int64_t packets, int64_t bytes) {
  hub().Release(ordinal, packets, bytes);
}

HCB_EXPORT int hcb_wait_finished(int64_t ordinal, int64_t target,
                                 double timeout_s) {
  return hub().WaitFinished(ordinal, target, timeout_s) ? 1 : 0;
}

// Writes bytes waiting, packets waiting (enqueued, not finished), high-water
// bytes and packets ever enqueued.
HCB_EXPORT void hcb_stats(int64_t ordinal, int64_t* out) {
  hcb::DeviceQueue* queue = hub().Queue(ordinal);
  std::lock_guard<std::mutex> lock(queue->mu);
  out[0] = queue->bytes;
  out[1] = queue->enqueued - queue->finished;
  out[2] = queue->high_water;
  out[3] = queue->enqueued;
}

// Posts a call's result arrays. Returns 0 when delivered, 1 when no device
// waits for the request any more, 2 when the sizes do not match (the device
// then fails with that message).
HCB_EXPORT int hcb_reply(int64_t request_id, int64_t count, void* const* data,
                         const int64_t* sizes) {
  std::vector<hcb::Span> results;
  for (int64_t i = 0; i < count; ++i) results.push_back({data[i], sizes[i]});
  std::string mismatch;
  if (!hub().Reply(request_id, results, &mismatch)) return 1;
  return mismatch.empty() ? 0 : 2;
}

// Makes the device waiting for `request_id` fail with `message`. Returns 0
// when delivered, 1 when no device waits for it any more.
HCB_EXPORT int hcb_reply_error(int64_t request_id, const char* message) {
  return hub().ReplyError(request_id, message) ? 0 : 1;
}
