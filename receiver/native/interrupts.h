// Ctrl-C for the native core: a device thread that waits on Python's main
// thread polls for a pending interrupt (the interrupt hook), gives up when
// there is one, and re-arms it on the main thread so that Python raises
// KeyboardInterrupt as soon as the failed computation returns to it. Never
// for another thread: an interrupt fails only the computation whose host
// function it stopped, and reaches only the thread that waits on it.
//
// Set by the extension module (python_hooks.cc) with the GIL; read by any
// device thread while it waits (DeviceQueue::Push, PendingRequest::Wait) or
// after a direct run was interrupted (DirectRuns::TryRun). Atomics only, no
// lock.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_INTERRUPTS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_INTERRUPTS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "status.h"

namespace hcb {

// How the message of a computation that Ctrl-C cancelled begins, on every
// path (receiver/ctrl_c.py:CANCELLED, the module's CTRL_C_CANCELLED).
inline constexpr char kCtrlCCancelled[] =
    "host_callback: Ctrl-C cancelled this computation";

// Called by a device that waits on Python's main thread (every
// kPollInterval): returns nonzero when Ctrl-C (SIGINT) is pending, clearing
// it, so that the wait gives up.
using InterruptHook = int (*)();
// Re-arms Ctrl-C (Python's PyErr_SetInterrupt, callable without the GIL).
using Rearm = void (*)();

class Interrupts {
 public:
  // Waits on the thread `main_thread` (pthread_self() of Python's main
  // thread) call `hook`, then `rearm` when it reports Ctrl-C; none without a
  // hook.
  void Set(InterruptHook hook, Rearm rearm, uint64_t main_thread);
  // Whether Ctrl-C is pending for the calling thread (only ever the main
  // thread); if so, it is taken: the caller cancels (Cancel) or re-arms it.
  bool Interrupted();
  // Calls the Rearm hook when the calling thread is Python's main thread.
  void RearmOnMainThread();
  // What a computation that Ctrl-C stopped fails with (`where`: while it
  // did what), counted; Ctrl-C is re-armed for Python on the main thread.
  Status Cancel(const std::string& where);
  // How many computations Ctrl-C cancelled.
  int64_t cancellations() const {
    return cancellations_.load(std::memory_order_seq_cst);
  }

 private:
  bool OnMainThread();

  std::atomic<InterruptHook> hook_{nullptr};
  std::atomic<Rearm> rearm_{nullptr};
  std::atomic<uint64_t> main_thread_{0};
  std::atomic<int64_t> cancellations_{0};
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_INTERRUPTS_H_
