// Calls: the reply slots of pending requests (a `call`, or a tap in the
// synchronous mode, that went through the queue), and the replies and errors
// the receiver posts into them.
//
// A device thread opens a PendingRequest, which lives on its stack and puts
// its slot in the table under an id that its packet carries; it waits for
// the reply (PendingRequest::Wait). A receiver thread answers with Reply or
// ReplyError: it first claims the slot (takes it out of the table), then
// writes the results into the device's output buffers outside any table
// lock, then finishes it under the slot's own `mu`. A slot leaves the table
// when its device gives up or when a replier claims it; a claimed slot is
// finished before its device may return. DeviceQueue::Take asks Waiting()
// to drop the requests that nobody waits for any more.
//
// Locks: `mu_` guards `slots_` and `next_request_`; a slot's `mu` is taken
// under `mu_` only by WakeAll. Neither is held while a queue's lock is.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_CALLS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_CALLS_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "interrupts.h"
#include "packet.h"
#include "receiver_link.h"
#include "status.h"

namespace hcb {

// The reply slot of one pending request; lives on the waiting device thread.
struct ReplySlot {
  const Span* outputs = nullptr;      // where the result bytes go
  size_t num_outputs = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> state{0};          // kPending, kDone or kFailed
  std::string error;                  // written before state turns kFailed
};
constexpr int kPending = 0, kDone = 1, kFailed = 2;

// What became of a reply (the values are the module's `reply` return codes,
// receiver/native_decode.py).
enum class ReplyOutcome : int {
  kDelivered = 0,
  kNoWaiter = 1,
  kSizeMismatch = 2,
};

// The message of a result whose array sizes (`result_bytes(i)` each) are not
// the device's `outputs`; shared by replies and direct runs.
template <typename ResultBytes>
std::string ResultSizesDiffer(size_t num_results, ResultBytes result_bytes,
                              const Span* outputs, size_t num_outputs) {
  return "host_callback: the host's result for a call has arrays of " +
         ByteSizes(num_results, result_bytes) +
         " bytes where the device expects " +
         ByteSizes(num_outputs, [&](size_t i) { return outputs[i].bytes; });
}

class Calls {
 public:
  // A device that waits for a reply gives up on Ctrl-C (`interrupts`) and
  // when no receiver can answer (`receiver`).
  Calls(Interrupts* interrupts, ReceiverLink* receiver)
      : interrupts_(interrupts), receiver_(receiver) {}

  // Posts the result of request `request_id`, copying the result bytes into
  // the device's outputs outside `mu_`. When their sizes do not match, the
  // device fails with a message that says so.
  ReplyOutcome Reply(int64_t request_id, const Span* results,
                     size_t num_results);
  // Fails request `request_id` with `message`; false if no device waits.
  bool ReplyError(int64_t request_id, std::string message);
  // Whether a device still waits for request `request_id`.
  bool Waiting(int64_t request_id);
  // Whether any device waits for a reply.
  bool AnyWaiting();
  // Wakes every waiting device, so that it re-checks the receiver.
  void WakeAll();

 private:
  friend class PendingRequest;

  // Takes the slot of `request_id` out of `slots_` for its replier.
  ReplySlot* Claim(int64_t request_id);
  static void Finish(ReplySlot* slot, int state);

  Interrupts* const interrupts_;
  ReceiverLink* const receiver_;
  std::mutex mu_;
  std::unordered_map<int64_t, ReplySlot*> slots_;
  int64_t next_request_ = 1;
};

// A request's reply slot, in the table from construction until its device
// stops waiting; the destructor waits for a replier that claimed it.
class PendingRequest {
 public:
  PendingRequest(Calls* calls, const Span* outputs, size_t num_outputs);
  PendingRequest(const PendingRequest&) = delete;
  PendingRequest& operator=(const PendingRequest&) = delete;
  ~PendingRequest();

  int64_t id() const { return id_; }
  bool Answered() const {
    return slot_.state.load(std::memory_order_acquire) != kPending;
  }
  // Waits for the reply; gives up on Ctrl-C or when no receiver can answer.
  Status Wait(int64_t device_id);

 private:
  Calls* calls_;
  ReplySlot slot_;
  int64_t id_ = 0;
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_CALLS_H_
