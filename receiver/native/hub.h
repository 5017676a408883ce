// The hub: the process-wide registry of the native core. It owns one of each
// part and wires them together: the device queues (device_queue.h, created
// on first use and never freed), the CPU's block pool (block_pool.h), the
// reply slots of requests (calls.h), direct runs (direct_runs.h), Ctrl-C
// (interrupts.h), the link to the receiver (receiver_link.h), the sites'
// array sizes (site_sizes.h), and the GPUs' pinned blocks and copies in
// flight (cuda_copies.h).
//
// Device threads enter through Send and Call (from the FFI handlers,
// ffi_cpu.cc); the Python receiver reaches the parts through the extension
// module (module_*.cc, python_hooks.cc). A receiver attaches to the queues
// and detaches from them; they live for the whole process. No method lets a
// C++ exception escape with state half-changed: callers (the module, the
// FFI handlers) turn them into errors.
//
// Locks: `mu_` guards `queues_` (and the setting of `fast_`); the methods
// that visit every queue (Attach, Detach, SetRestartHook, WakeConsumers,
// Drained: ForEachQueue) call queue methods, which take the queue's own
// lock, under it. Each part's other locks are its own (see its header).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "block_pool.h"
#include "calls.h"
#include "cuda_copies.h"
#include "device_queue.h"
#include "direct_runs.h"
#include "interrupts.h"
#include "packet.h"
#include "receiver_link.h"
#include "site_sizes.h"
#include "status.h"

namespace hcb {

class Hub {
 public:
  static Hub& Get();

  // A receiver starts (again) with this queue bound; the queues' high-water
  // marks restart.
  void Attach(int64_t max_bytes);
  // The receiver stopped. Returns whether packets are left for the next one
  // (sent after the last drain); a device that sends from now on calls the
  // restart hook.
  bool Detach();
  // Without a hook (at interpreter exit), a device that needs a receiver
  // fails instead, and so do the devices waiting now.
  void SetRestartHook(RestartHook hook);
  // Wakes every consumer waiting in Take, so that it re-checks its stop flag.
  void WakeConsumers();

  // The queue of a device, created on first use; never freed.
  DeviceQueue* Queue(int64_t device_id);
  // Whether every packet pushed so far, on any queue, is finished: what a
  // barrier checks, in one call, once the devices have finished.
  bool Drained();
  // On a barrier's thread, once the devices it waits for have finished:
  // the taps waiting on each CPU queue that holds at most `max_waiting`
  // packets run here, as those before a request do (the guest consumer,
  // direct_runs.h), not on a receiver thread woken for them; the rest stay
  // for the consumer threads. kInterrupted once Ctrl-C stopped one.
  GuestOutcome RunWaitingTaps(int64_t max_waiting);

  // Device side, with arrays checked against the site (SiteSizes::Check):
  // a tap's packet on the device's queue (DeviceQueue::Push).
  Status Send(int64_t device_id, int64_t site, const Span* arrays,
              size_t num_arrays);
  // Device side: a request (a call, or a synchronous tap) run directly, or
  // sent as a packet whose reply the device waits for, written into
  // `outputs`.
  Status Call(int64_t device_id, int64_t site, const Span* arrays,
              size_t num_arrays, const Span* outputs, size_t num_outputs);

  // Device side, CUDA (cuda_copies.h; from ffi_cuda.cc): a tap's packet
  // from GPU `ordinal`, copied on `stream` into a pinned block and queued
  // once the copy landed.
  Status CudaSend(int64_t ordinal, void* stream, int64_t site,
                  const Span* arrays, size_t num_arrays);
  // A call from GPU `ordinal`: a buffers=True site's runs directly on the
  // GPU's buffers and `stream`, after the taps sent before it
  // (CudaBuffersCall); any other call's arguments are copied in (waiting
  // for that copy only), the request made as Call makes it, its results
  // copied out.
  Status CudaCall(int64_t ordinal, void* stream, int64_t site,
                  const Span* arrays, size_t num_arrays, const Span* outputs,
                  size_t num_outputs);

  BlockPool& pool() { return pool_; }  // the CPU's blocks
  CudaCopies& cuda() { return cuda_; }
  Calls& calls() { return calls_; }
  DirectRuns& direct_runs() { return direct_runs_; }
  Interrupts& interrupts() { return interrupts_; }
  SiteSizes& sites() { return sites_; }

 private:
  Hub();
  // Calls `visit(queue)` for every queue, under `mu_`.
  template <typename Visit>
  void ForEachQueue(Visit visit) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : queues_) visit(*entry.second);
  }
  // A buffers=True site's call from GPU `ordinal` run directly on the
  // device's buffers, once its queue is idle (the taps sent before it
  // landed and were consumed: the order holds); false when it did not run
  // (DirectRuns::RunAfterQueued: no runner, or a sub-byte dtype, or made
  // on the GPU's consumer thread), and it then takes the copies.
  bool CudaBuffersCall(int64_t ordinal, void* stream, int64_t site,
                       const Span* arrays, size_t num_arrays,
                       const Span* outputs, size_t num_outputs,
                       Status* status);
  // A request made on its device's consumer thread, inside a host function:
  // queued, and served by this thread (the NestedConsumer) after what the
  // device sent before it.
  Status CallOnConsumer(int64_t device_id, DeviceQueue* queue, int64_t site,
                        const Span* arrays, size_t num_arrays,
                        const Span* outputs, size_t num_outputs);

  Interrupts interrupts_;
  ReceiverLink receiver_;
  MappedAllocator allocator_;
  BlockPool pool_;
  Calls calls_;
  CudaCopies cuda_;  // pinned blocks and copies in flight, for GPUs
  DirectRuns direct_runs_;
  SiteSizes sites_;
  std::mutex mu_;
  std::unordered_map<int64_t, std::unique_ptr<DeviceQueue>> queues_;
  // Lock-free lookup for small device ids; entries are set once under `mu_`.
  static constexpr int64_t kFastDeviceIds = 1024;
  std::atomic<DeviceQueue*> fast_[kFastDeviceIds] = {};
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_
