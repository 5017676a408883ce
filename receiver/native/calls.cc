// Reply slots, replies and errors: see calls.h.

#include "calls.h"

#include <cstring>
#include <new>
#include <utility>

#include "waits.h"

namespace hcb {
namespace {

// How long a device that waits for a reply polls before it sleeps.
constexpr auto kReplySpin = std::chrono::microseconds(50);

}  // namespace

PendingRequest::PendingRequest(Calls* calls, const Span* outputs,
                               size_t num_outputs)
    : calls_(calls) {
  slot_.outputs = outputs;
  slot_.num_outputs = num_outputs;
  std::lock_guard<std::mutex> lock(calls->mu_);
  id_ = calls->next_request_++;
  calls->slots_[id_] = &slot_;
}

PendingRequest::~PendingRequest() {
  bool claimed;
  {
    std::lock_guard<std::mutex> lock(calls_->mu_);
    claimed = calls_->slots_.erase(id_) == 0;
  }
  if (claimed) {  // its replier finishes it (under `slot_.mu`) soon
    std::unique_lock<std::mutex> lock(slot_.mu);
    slot_.cv.wait(lock, [&] { return Answered(); });
  }
}

Status PendingRequest::Wait(int64_t device_id) {
  auto answered = [&] { return Answered(); };
  if (!Spin(kReplySpin, answered)) {
    while (!answered()) {
      {
        std::unique_lock<std::mutex> lock(slot_.mu);
        slot_.cv.wait_for(lock, kPollInterval, answered);
      }
      if (answered()) break;
      if (calls_->interrupts_->Interrupted()) {
        return calls_->interrupts_->Cancel(
            "while the device waited for a host function");
      }
      if (Status status = calls_->receiver_->EnsureReceiver(device_id);
          !status.ok()) {
        status.message += " while it waited for the result of a "
                          "host_callback.call";
        return status;
      }
    }
  }
  if (slot_.state.load(std::memory_order_acquire) == kDone) return Status();
  return Failure(Code::kInternal,
                 slot_.error.empty()
                     ? "host_callback: the host could not deliver its reply"
                     : slot_.error);
}

void Calls::Finish(ReplySlot* slot, int state) {
  // Notified under the lock: the slot's device may free it once it holds it.
  std::lock_guard<std::mutex> lock(slot->mu);
  slot->state.store(state, std::memory_order_release);
  slot->cv.notify_all();
}

ReplySlot* Calls::Claim(int64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return nullptr;
  ReplySlot* slot = it->second;
  slots_.erase(it);
  return slot;
}

bool Calls::Waiting(int64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.count(request_id) > 0;
}

bool Calls::AnyWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  return !slots_.empty();
}

void Calls::WakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, slot] : slots_) {
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    slot->cv.notify_all();
  }
}

ReplyOutcome Calls::Reply(int64_t request_id, const Span* results,
                          size_t num_results) {
  ReplySlot* slot = Claim(request_id);
  if (slot == nullptr) return ReplyOutcome::kNoWaiter;
  // Claimed: its device waits for Finish, and nothing below throws after
  // the message.
  bool same = num_results == slot->num_outputs;
  for (size_t i = 0; same && i < num_results; ++i) {
    same = results[i].bytes == slot->outputs[i].bytes;
  }
  if (!same) {
    std::string message;
    try {
      message = ResultSizesDiffer(
          num_results, [&](size_t i) { return results[i].bytes; },
          slot->outputs, slot->num_outputs);
    } catch (const std::bad_alloc&) {
      message.clear();  // the device reports a reply it could not get
    }
    slot->error.swap(message);
    Finish(slot, kFailed);
    return ReplyOutcome::kSizeMismatch;
  }
  for (size_t i = 0; i < num_results; ++i) {
    if (results[i].bytes > 0) {
      std::memcpy(slot->outputs[i].data, results[i].data, results[i].bytes);
    }
  }
  Finish(slot, kDone);
  return ReplyOutcome::kDelivered;
}

bool Calls::ReplyError(int64_t request_id, std::string message) {
  ReplySlot* slot = Claim(request_id);
  if (slot == nullptr) return false;
  slot->error.swap(message);
  Finish(slot, kFailed);
  return true;
}

}  // namespace hcb
