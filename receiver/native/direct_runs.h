// Direct runs: a request (a `call`, or a tap in the synchronous mode) whose
// device queue is idle runs its host function on the device's own thread,
// through the DirectRunner (python_runner.cc), instead of two thread
// hand-offs through the queue. A direct run claims the queue (the consumer
// takes nothing meanwhile); a host function that makes a request of its own
// device while it runs suspends the claim, so that the consumer may answer
// it (Suspension). Requests made on a device's consumer thread are served
// there by the NestedConsumer.
//
// A GPU's buffers=True call cannot go through the queue (its buffers exist
// only on the device thread): behind packets its device sent before it, it
// waits for them to be consumed and then runs directly (RunAfterQueued).
//
// Device threads call TryRun, RunAfterQueued and Suspension; the extension
// module sets the hooks with the GIL (atomics). The claim is the
// DeviceQueue's (ClaimIfIdle, ClaimWhenIdle, EndClaim, SuspendClaim,
// ResumeClaim), and so is whether a thread is its consumer
// (ConsumingOnThisThread).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_DIRECT_RUNS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_DIRECT_RUNS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "device_queue.h"
#include "interrupts.h"
#include "packet.h"
#include "status.h"

namespace hcb {

// What a direct runner is asked to do: run the host function of `site` on
// the arrays `args` (device buffers, valid during the call) and write its
// results into `outputs` (the device's result buffers). With `gpu` set
// (a buffers=True site's call on GPU `gpu`, hub.cc:Hub::CudaCall), the
// buffers are that GPU's memory and `stream` the computation's stream.
// `queued`: a tap that waited on the queue, run by a later request on its
// thread (GuestConsumer): its failure is no request's.
struct DirectRequest {
  int64_t device_id;
  int64_t site;
  const Span* args;
  size_t num_args;
  const Span* outputs;
  size_t num_outputs;
  int64_t gpu = -1;  // -1: host memory
  void* stream = nullptr;
  bool queued = false;
};

// What became of a direct run.
enum class DirectOutcome : int {
  kDone = 0,
  kFailed = 1,       // the host function (or its result) failed: `error`
  kDeclined = 2,     // not run: the request goes through the queue instead
  kInterrupted = 3,  // Ctrl-C (KeyboardInterrupt) stopped it: `error`
};

// Runs a request's host function on the device thread (the extension
// module's runner, which takes the GIL). It declines only before the host
// function ran.
using DirectRunner = DirectOutcome (*)(const DirectRequest& request,
                                       std::string* error);

// Called by a device's consumer thread that makes a request of its own
// device (a host function running JAX code in the outfeed mode): consumes,
// in the device's order, what the consumer has taken and not yet consumed,
// else the next batch. Returns 0, or nonzero when no receiver can consume.
using NestedConsumer = int (*)(int64_t device_id);

// What a guest consumer did (GuestConsumer).
enum class GuestOutcome : int {
  kDone = 0,         // consumed what it could; the queue may still be busy
  kInterrupted = 1,  // Ctrl-C stopped a host function it ran
};

// Called by a device thread whose request finds packets waiting on its
// queue (the outfeed mode's taps before a call): runs the taps that wait
// first on this thread, in the device's order, as barrier_wait's guest
// does, where no consumer holds a batch (python_runner.h:RunWaitingTaps);
// then the request may run directly instead of waiting for the consumer
// thread to run them.
using GuestConsumer = GuestOutcome (*)(int64_t device_id);

class DirectRuns {
 public:
  // A direct run interrupted on Python's main thread re-arms Ctrl-C there.
  explicit DirectRuns(Interrupts* interrupts) : interrupts_(interrupts) {}

  // With a runner, a request whose queue is idle runs on the device thread.
  void set_runner(DirectRunner runner) {
    runner_.store(runner, std::memory_order_seq_cst);
  }
  // With a nested consumer, a request made on a device's consumer thread is
  // queued and served by that thread; without, it fails.
  void set_nested_consumer(NestedConsumer consumer) {
    nested_consumer_.store(consumer, std::memory_order_seq_cst);
  }
  NestedConsumer nested_consumer() const {
    return nested_consumer_.load(std::memory_order_seq_cst);
  }
  // With a guest consumer, a request first runs the packets waiting before
  // it itself (GuestConsumer).
  void set_guest_consumer(GuestConsumer consumer) {
    guest_consumer_.store(consumer, std::memory_order_seq_cst);
  }
  GuestConsumer guest_consumer() const {
    return guest_consumer_.load(std::memory_order_seq_cst);
  }

  // Runs `request` directly when there is a runner and `queue` is idle
  // (every packet sent was consumed and released), with `*status` its
  // outcome; false when it did not (the request then goes through the
  // queue).
  bool TryRun(DeviceQueue* queue, const DirectRequest& request,
              Status* status);
  // Runs `request` directly once every packet sent before it on `queue`
  // was consumed (a GPU's buffers=True call behind taps in flight or
  // queued): waits until the queue is idle, then runs it as TryRun does.
  // Ctrl-C, or no receiver to consume them, ends the wait with `*status`
  // the error (true). False when it did not run: no runner, the runner
  // declined, or the calling thread is the queue's consumer (which would
  // wait for itself); the request then goes through the queue.
  bool RunAfterQueued(DeviceQueue* queue, const DirectRequest& request,
                      Status* status);

  // While a direct run's own thread waits for the consumer (a host function
  // that runs JAX code with a request on its device), the consumer may take.
  class Suspension {
   public:
    explicit Suspension(DeviceQueue* queue);
    ~Suspension();
    Suspension(const Suspension&) = delete;
    Suspension& operator=(const Suspension&) = delete;

   private:
    DeviceQueue* queue_;
    bool active_;  // whether it suspended a claim, to resume
  };

 private:
  // Runs `request` with `runner` on `queue`, which the calling thread has
  // claimed, and ends that claim; false when the runner declined.
  bool RunClaimed(DirectRunner runner, DeviceQueue* queue,
                  const DirectRequest& request, Status* status);

  std::atomic<DirectRunner> runner_{nullptr};
  std::atomic<NestedConsumer> nested_consumer_{nullptr};
  std::atomic<GuestConsumer> guest_consumer_{nullptr};
  Interrupts* const interrupts_;
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_DIRECT_RUNS_H_
