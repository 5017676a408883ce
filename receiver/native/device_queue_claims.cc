// The claims on a device queue (device_queue.h): a direct run's (a host
// function run on the device's thread, direct_runs.h), a guest's (a barrier
// that consumes waiting packets itself), their suspension while the owner
// waits for a request of its own device, and the consumer's thread. Kept
// apart from the packets' path (device_queue.cc); the same `mu_` guards both.
// The protocol, its states and its names are the Python queue's too
// (receiver/queues.py): see "The queue protocol" in docs/architecture.md.

#include "device_queue.h"

#include <string>

#include "waits.h"

namespace hcb {

bool DeviceQueue::NextInChunk(PacketHeader* header) const {
  bool first = true;
  for (const auto& chunk : chunks_) {
    if (chunk->block != nullptr) return false;
    const int64_t offset = first ? read_offset_ : 0;
    first = false;
    if (offset < chunk->used) {
      *header = ReadHeader(chunk->begin() + offset);
      return true;
    }
  }
  return false;
}

bool DeviceQueue::NextTapSite(int64_t* site) {
  std::lock_guard<std::mutex> lock(mu_);
  PacketHeader header;
  if (unread_ == 0 || !NextInChunk(&header) || header.request_id != 0) {
    return false;
  }
  *site = header.site;
  return true;
}

int64_t DeviceQueue::TakeAsGuest(uint8_t* dst, int64_t capacity,
                                 IndexEntry* index, int64_t* needed,
                                 const Tap* tap) {
  *needed = 0;
  std::unique_lock<std::mutex> lock(mu_);
  // No consumer holds a batch (it would finish it first), no host function
  // runs on a device thread, and a packet waits.
  if (taken_ > 0 || claim_depth_ > 0 || unread_ == 0) {
    return 0;
  }
  PacketHeader next;
  if (tap != nullptr &&
      (!NextInChunk(&next) || next.request_id != 0 || next.site != tap->site ||
       next.size != tap->bytes)) {
    return 0;
  }
  // Claimed before TakeWaiting unlocks: the consumer takes nothing after
  // the guest's packet until the guest has consumed it.
  guest_ = true;
  Claim();
  const int64_t count = TakeWaiting(lock, dst, capacity, index,
                                    /*max_packets=*/1, needed,
                                    /*by_consumer=*/false);
  guest_packets_ = count;
  guest_bytes_ = 0;
  for (int64_t i = 0; i < count; ++i) guest_bytes_ += index[i].size;
  if (count == 0) {  // too large for `dst`, or dropped: nothing to consume
    lock.unlock();
    EndGuest();
  }
  return count;
}

void DeviceQueue::EndGuest() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!guest_ || !HoldsClaim()) return;
  finished_ += guest_packets_;
  bytes_ -= guest_bytes_;
  guest_ = false;
  guest_packets_ = guest_bytes_ = 0;
  changed_.notify_all();
  ReleaseClaim();
}

bool DeviceQueue::ClaimIfIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!IdleForThisThread()) return false;
  Claim();
  return true;
}

Status DeviceQueue::ClaimWhenIdle() {
  static constexpr char kWhere[] =
      "while a call on a GPU's buffers waited for the taps before it";
  std::unique_lock<std::mutex> lock(mu_);
  while (!IdleForThisThread()) {
    ++finish_waiters_;  // packets pushed meanwhile hurry the consumer
    if (unread_ > 0) {
      hurry_ = true;
      WakeConsumer();
    }
    const bool idle = changed_.wait_for(
        lock, kPollInterval, [&] { return IdleForThisThread(); });
    --finish_waiters_;
    if (idle) break;
    lock.unlock();  // the hooks run Python
    const bool interrupted = links_.interrupts->Interrupted();
    Status receiver =
        interrupted ? Status() : links_.receiver->EnsureReceiver(device_id_);
    lock.lock();
    if (interrupted) return links_.interrupts->Cancel(kWhere);
    if (!receiver.ok()) {
      receiver.message += std::string(" ") + kWhere;
      return receiver;
    }
  }
  Claim();
  return Status();
}

void DeviceQueue::EndClaim() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HoldsClaim()) return;
  if (--claim_depth_ > 0) return;
  ReleaseClaim();
}

bool DeviceQueue::ConsumingOnThisThread() {
  std::lock_guard<std::mutex> lock(mu_);
  return ConsumingHere();
}

bool DeviceQueue::SuspendClaim() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!claim_active_ || !HoldsClaim()) return false;
  claim_active_ = false;
  not_empty_.notify_all();
  return true;
}

void DeviceQueue::ResumeClaim() {
  std::unique_lock<std::mutex> lock(mu_);
  claim_active_ = true;  // the consumer takes nothing new
  // What the consumer took meanwhile it finishes first (Release wakes us);
  // it may take again meanwhile, nested (Take).
  while (taken_ > 0 && !ConsumingHere()) {
    if (changed_.wait_for(lock, kPollInterval, [&] { return taken_ == 0; })) {
      return;
    }
    lock.unlock();  // the hook takes the GIL
    const bool interrupted = links_.interrupts->Interrupted();
    lock.lock();
    if (interrupted) {  // Python raises KeyboardInterrupt
      links_.interrupts->RearmOnMainThread();
      return;
    }
  }
}

}  // namespace hcb
