// The process-wide registry of the native core: see hub.h.

#include "hub.h"

#include <string>
#include <vector>

namespace hcb {

Hub::Hub()
    : pool_(&allocator_, kDefaultQueueBound),
      calls_(&interrupts_, &receiver_),
      direct_runs_(&interrupts_) {}

Hub& Hub::Get() {
  // Never destroyed: device threads may outlive the interpreter.
  static Hub* hub = new Hub();
  return *hub;
}

void Hub::Attach(int64_t max_bytes) {
  receiver_.set_queue_bound(max_bytes);
  pool_.SetQueueBound(max_bytes);
  cuda_.SetQueueBound(max_bytes);
  // Statistics start with the receiver.
  ForEachQueue([](DeviceQueue& queue) { queue.RestartHighWater(); });
  receiver_.set_attached(true);
}

bool Hub::Detach() {
  // A device that pushes after this store sees it and calls the hook; one
  // that pushed before is seen below. Either way its packet is not orphaned.
  receiver_.set_attached(false);
  bool pending = calls_.AnyWaiting();
  ForEachQueue([&pending](DeviceQueue& queue) {
    pending = queue.HasUntaken() || pending;
    queue.WakeWaiters();
  });
  return pending;
}

void Hub::SetRestartHook(RestartHook hook) {
  receiver_.set_restart_hook(hook);
  if (hook != nullptr) return;
  // Wake the devices that wait, so that they fail instead.
  ForEachQueue([](DeviceQueue& queue) { queue.WakeWaiters(); });
  calls_.WakeAll();
}

void Hub::WakeConsumers() {
  receiver_.NextWakeGeneration();
  ForEachQueue([](DeviceQueue& queue) { queue.WakeConsumerToStop(); });
}

bool Hub::Drained() {
  bool drained = true;
  ForEachQueue([&drained](DeviceQueue& queue) {
    drained = drained && queue.Drained();
  });
  return drained;
}

GuestOutcome Hub::RunWaitingTaps(int64_t max_waiting) {
  const GuestConsumer guest = direct_runs_.guest_consumer();
  if (guest == nullptr) return GuestOutcome::kDone;
  std::vector<int64_t> waiting;  // run after ForEachQueue let `mu_` go
  ForEachQueue([&](DeviceQueue& queue) {
    const int64_t packets = queue.ReadStats().waiting;
    if (queue.device_id() < kCudaQueueBase && packets > 0 &&
        packets <= max_waiting) {
      waiting.push_back(queue.device_id());
    }
  });
  for (const int64_t device_id : waiting) {
    if (guest(device_id) == GuestOutcome::kInterrupted) {
      return GuestOutcome::kInterrupted;
    }
  }
  return GuestOutcome::kDone;
}

DeviceQueue* Hub::Queue(int64_t device_id) {
  const bool fast = device_id >= 0 && device_id < kFastDeviceIds;
  if (fast) {
    if (DeviceQueue* queue = fast_[device_id].load(std::memory_order_acquire)) {
      return queue;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& entry = queues_[device_id];
  if (entry == nullptr) {
    entry = std::make_unique<DeviceQueue>(
        device_id, QueueLinks{&receiver_, &interrupts_, &pool_, &calls_});
    if (fast) fast_[device_id].store(entry.get(), std::memory_order_release);
  }
  return entry.get();
}

Status Hub::Send(int64_t device_id, int64_t site, const Span* arrays,
                 size_t num_arrays) {
  return Queue(device_id)->Push(site, /*request_id=*/0, arrays, num_arrays);
}

Status Hub::Call(int64_t device_id, int64_t site, const Span* arrays,
                 size_t num_arrays, const Span* outputs, size_t num_outputs) {
  DeviceQueue* queue = Queue(device_id);
  // A CPU's taps waiting before the request run here first (a GPU's queue,
  // whose taps land from its stream, is left to its consumer).
  GuestConsumer guest = direct_runs_.guest_consumer();
  if (guest != nullptr && device_id < kCudaQueueBase && queue->HasUntaken() &&
      guest(device_id) == GuestOutcome::kInterrupted) {
    return interrupts_.Cancel("while a tap before a call ran on the main "
                              "thread");
  }
  Status direct;
  if (direct_runs_.TryRun(queue,
                          DirectRequest{device_id, site, arrays, num_arrays,
                                        outputs, num_outputs},
                          &direct)) {
    return direct;
  }
  if (queue->ConsumingOnThisThread()) {
    return CallOnConsumer(device_id, queue, site, arrays, num_arrays, outputs,
                          num_outputs);
  }
  DirectRuns::Suspension suspension(queue);  // the consumer may answer it
  PendingRequest request(&calls_, outputs, num_outputs);
  if (Status status = queue->Push(site, request.id(), arrays, num_arrays);
      !status.ok()) {
    return status;
  }
  return request.Wait(device_id);
}

Status Hub::CallOnConsumer(int64_t device_id, DeviceQueue* queue, int64_t site,
                           const Span* arrays, size_t num_arrays,
                           const Span* outputs, size_t num_outputs) {
  NestedConsumer consume = direct_runs_.nested_consumer();
  if (consume == nullptr) {
    return Failure(
        Code::kFailedPrecondition,
        "host_callback: a call (or synchronous tap) made from inside a host "
        "function that the receiver thread of device " +
            std::to_string(device_id) +
            " runs cannot be served: the receiver has shut down");
  }
  PendingRequest request(&calls_, outputs, num_outputs);
  if (Status status = queue->Push(site, request.id(), arrays, num_arrays);
      !status.ok()) {
    return status;
  }
  while (!request.Answered()) {
    if (consume(device_id) != 0) {
      return Failure(Code::kUnavailable,
                     "host_callback: no receiver could serve a call made "
                     "from a host function of device " +
                         std::to_string(device_id));
    }
  }
  return request.Wait(device_id);
}

Status Hub::CudaSend(int64_t ordinal, void* stream, int64_t site,
                     const Span* arrays, size_t num_arrays) {
  return cuda_.Send(ordinal, Queue(CudaQueueId(ordinal)), stream, site, arrays,
                    num_arrays);
}

Status Hub::CudaCall(int64_t ordinal, void* stream, int64_t site,
                     const Span* arrays, size_t num_arrays,
                     const Span* outputs, size_t num_outputs) {
  Status direct;
  if (CudaBuffersCall(ordinal, stream, site, arrays, num_arrays, outputs,
                      num_outputs, &direct)) {
    return direct;
  }
  std::vector<Span> host_in(num_arrays), host_out(num_outputs);
  Block* in = nullptr;
  if (Status status = cuda_.CopyIn(ordinal, stream, arrays, num_arrays, &in,
                                   host_in.data());
      !status.ok()) {
    return status;
  }
  Block* out = nullptr;
  Status status =
      cuda_.ResultBlock(outputs, num_outputs, &out, host_out.data());
  if (status.ok()) {
    status = Call(CudaQueueId(ordinal), site, host_in.data(), num_arrays,
                  host_out.data(), num_outputs);
  }
  ReturnBlock(in);  // its copy landed, and the host function returned
  if (!status.ok()) {
    if (out != nullptr) ReturnBlock(out);
    return status;
  }
  return cuda_.CopyOut(ordinal, stream, out, host_out.data(), outputs,
                       num_outputs);
}

bool Hub::CudaBuffersCall(int64_t ordinal, void* stream, int64_t site,
                          const Span* arrays, size_t num_arrays,
                          const Span* outputs, size_t num_outputs,
                          Status* status) {
  if (!sites_.TakesBuffers(site)) return false;
  const int64_t queue_id = CudaQueueId(ordinal);
  // Its buffers exist only here: behind taps, it waits for them.
  return direct_runs_.RunAfterQueued(
      Queue(queue_id),
      DirectRequest{queue_id, site, arrays, num_arrays, outputs, num_outputs,
                    ordinal, stream},
      status);
}

}  // namespace hcb
