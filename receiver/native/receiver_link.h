// The device side's link to the Python receiver: whether one is attached,
// the queue bound it set, the restart hook that attaches a new one, and the
// wake-up of consumers that should re-check their stop flag.
//
// The receiver (through the extension module) attaches and detaches with the
// GIL; device threads check the link before and after each packet
// (EnsureReceiver) and while they wait; consumers read the wake generation
// in DeviceQueue::Take. Atomics only, no lock: Hub::Attach, Hub::Detach and
// Hub::SetRestartHook also wake the waiters of every queue and reply slot.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_RECEIVER_LINK_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_RECEIVER_LINK_H_

#include <atomic>
#include <cstdint>

#include "status.h"

namespace hcb {

// Called by a device that needs a receiver while none is attached; returns 0
// once one is attached. It is the only call into Python on the way of a tap.
using RestartHook = int (*)();

// The queue bound until a receiver sets one (bytes).
constexpr int64_t kDefaultQueueBound = 256'000'000;

class ReceiverLink {
 public:
  bool attached() const { return attached_.load(std::memory_order_seq_cst); }
  void set_attached(bool attached) {
    attached_.store(attached, std::memory_order_seq_cst);
  }
  // Bytes a device's queue may hold before its device waits.
  int64_t queue_bound() const {
    return queue_bound_.load(std::memory_order_acquire);
  }
  void set_queue_bound(int64_t bytes) {
    queue_bound_.store(bytes, std::memory_order_release);
  }
  // Without a hook (at interpreter exit), a device that needs a receiver
  // fails instead.
  void set_restart_hook(RestartHook hook) {
    restart_hook_.store(hook, std::memory_order_seq_cst);
  }

  // Empty when a receiver is attached, after calling the hook if needed.
  Status EnsureReceiver(int64_t device_id) {
    if (attached()) return Status();
    return Restart(device_id);
  }

  // Consumers waiting in Take return when this changes (WakeConsumers).
  int64_t wake_generation() const {
    return wake_generation_.load(std::memory_order_seq_cst);
  }
  void NextWakeGeneration() {
    wake_generation_.fetch_add(1, std::memory_order_seq_cst);
  }

 private:
  // Calls the restart hook; the error that `device_id` reports without one.
  Status Restart(int64_t device_id);

  std::atomic<bool> attached_{false};
  std::atomic<int64_t> queue_bound_{kDefaultQueueBound};
  std::atomic<RestartHook> restart_hook_{nullptr};
  std::atomic<int64_t> wake_generation_{0};
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_RECEIVER_LINK_H_
