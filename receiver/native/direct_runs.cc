// Direct runs on the device thread: see direct_runs.h.

#include "direct_runs.h"

#include <mutex>
#include <thread>
#include <utility>

namespace hcb {
namespace {

// Claims the device for a direct run when nothing is queued or being
// consumed; false otherwise. Nested runs on the owner's thread deepen it.
bool BeginDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  const std::thread::id me = std::this_thread::get_id();
  if (queue->direct_depth > 0 && queue->direct_owner != me) return false;
  // Finished counts lag until the consumer's next Take: a consumer between
  // batches still counts as busy, so order with queued packets holds.
  if (queue->enqueued != queue->finished) return false;
  queue->Claim();
  return true;
}

void EndDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  if (--queue->direct_depth > 0) return;
  queue->ReleaseClaim();
}

}  // namespace

bool DirectRuns::TryRun(DeviceQueue* queue, const DirectRequest& request,
                        Status* status) {
  DirectRunner runner = runner_.load(std::memory_order_seq_cst);
  if (runner == nullptr || !BeginDirect(queue)) return false;
  struct End {
    DeviceQueue* queue;
    ~End() { EndDirect(queue); }
  } end{queue};
  std::string error;
  switch (runner(request, &error)) {
    case DirectOutcome::kDone:
      *status = Status();
      return true;
    case DirectOutcome::kFailed:
      *status = Failure(Code::kInternal, std::move(error));
      return true;
    case DirectOutcome::kInterrupted:
      interrupts_->RearmOnMainThread();
      *status = Failure(Code::kCancelled, std::move(error));
      return true;
    case DirectOutcome::kDeclined:
      break;
  }
  return false;
}

bool DirectRuns::IsConsumer(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  return queue->consumer == std::this_thread::get_id();
}

DirectRuns::Suspension::Suspension(DeviceQueue* queue) : queue_(queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  active_ = queue->direct_depth > 0 &&
            queue->direct_owner == std::this_thread::get_id() &&
            queue->direct_busy;
  if (!active_) return;
  queue->direct_busy = false;
  queue->not_empty.notify_all();
}

DirectRuns::Suspension::~Suspension() {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(queue_->mu);
  queue_->direct_busy = true;
}

}  // namespace hcb
