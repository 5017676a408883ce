// Direct runs on the device thread: see direct_runs.h.

#include "direct_runs.h"

#include <string>
#include <utility>

namespace hcb {

bool DirectRuns::TryRun(DeviceQueue* queue, const DirectRequest& request,
                        Status* status) {
  DirectRunner runner = runner_.load(std::memory_order_seq_cst);
  if (runner == nullptr || !queue->ClaimIfIdle()) return false;
  return RunClaimed(runner, queue, request, status);
}

bool DirectRuns::RunAfterQueued(DeviceQueue* queue,
                                const DirectRequest& request, Status* status) {
  DirectRunner runner = runner_.load(std::memory_order_seq_cst);
  if (runner == nullptr || queue->ConsumingOnThisThread()) return false;
  {
    // A direct run of this thread's (a host function running JAX code)
    // lets the consumer take the packets before this request meanwhile.
    Suspension suspension(queue);
    if (Status waited = queue->ClaimWhenIdle(); !waited.ok()) {
      *status = std::move(waited);
      return true;
    }
  }
  return RunClaimed(runner, queue, request, status);
}

bool DirectRuns::RunClaimed(DirectRunner runner, DeviceQueue* queue,
                            const DirectRequest& request, Status* status) {
  struct EndClaim {
    DeviceQueue* queue;
    ~EndClaim() { queue->EndClaim(); }
  } end_claim{queue};
  std::string error;
  switch (runner(request, &error)) {
    case DirectOutcome::kDone:
      *status = Status();
      return true;
    case DirectOutcome::kFailed:
      *status = Failure(Code::kInternal, std::move(error));
      return true;
    case DirectOutcome::kInterrupted:
      *status = interrupts_->Cancel("while a host function ran on the main "
                                    "thread");
      return true;
    case DirectOutcome::kDeclined:
      break;
  }
  return false;
}

DirectRuns::Suspension::Suspension(DeviceQueue* queue)
    : queue_(queue), active_(queue->SuspendClaim()) {}

DirectRuns::Suspension::~Suspension() {
  if (active_) queue_->ResumeClaim();
}

}  // namespace hcb
