// The native core: see hub.h.

#include "hub.h"

#include <cstring>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace hcb {
namespace {

using Clock = std::chrono::steady_clock;

// How long a thread that expects an answer soon polls before it sleeps: a
// futex wake-up costs more than the packet itself.
constexpr auto kConsumerSpin = std::chrono::microseconds(20);
constexpr auto kReplySpin = std::chrono::microseconds(50);

inline void Relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done()` for up to `budget`; true if it became true.
template <typename Done>
bool Spin(std::chrono::microseconds budget, Done done) {
  const auto deadline = Clock::now() + budget;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && Clock::now() >= deadline) return false;
    Relax();
  }
}

std::chrono::microseconds Seconds(double s) {
  return std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

}  // namespace

Hub& Hub::Get() {
  static Hub* hub = new Hub();  // never destroyed: device threads may outlive exit
  return *hub;
}

void Hub::Attach(int64_t max_bytes) {
  max_bytes_.store(max_bytes, std::memory_order_release);
  stopped_.store(false, std::memory_order_release);
}

void Hub::Stop() {
  stopped_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [ordinal, queue] : queues_) {
    std::lock_guard<std::mutex> queue_lock(queue->mu);
    queue->not_empty.notify_all();
    queue->changed.notify_all();
  }
  for (auto& [id, slot] : slots_) {
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    slot->cv.notify_all();
  }
}

DeviceQueue* Hub::FindQueue(int64_t ordinal) {
  if (ordinal >= 0 && ordinal < kFastOrdinals) {
    if (DeviceQueue* queue = fast_[ordinal].load(std::memory_order_acquire)) {
      return queue;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(ordinal);
  return it == queues_.end() ? nullptr : it->second.get();
}

DeviceQueue* Hub::Queue(int64_t ordinal, bool* created) {
  if (created != nullptr) *created = false;
  if (DeviceQueue* queue = FindQueue(ordinal)) return queue;
  std::lock_guard<std::mutex> lock(mu_);
  auto& entry = queues_[ordinal];
  if (entry == nullptr) {
    entry = std::make_unique<DeviceQueue>();
    if (created != nullptr) *created = true;
    if (ordinal >= 0 && ordinal < kFastOrdinals) {
      fast_[ordinal].store(entry.get(), std::memory_order_release);
    }
  }
  return entry.get();
}

std::vector<int64_t> Hub::Ordinals() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ordinals;
  for (auto& [ordinal, queue] : queues_) ordinals.push_back(ordinal);
  return ordinals;
}

Status Hub::Send(int64_t ordinal, int64_t site, int64_t request_id,
                 const std::vector<Span>& arrays) {
  int64_t size = kHeaderBytes;
  for (const Span& array : arrays) size += AlignUp(array.bytes);
  PacketPtr packet(new uint8_t[size]);
  auto* header = reinterpret_cast<PacketHeader*>(packet.get());
  *header = PacketHeader{size, site, request_id, {}};
  int64_t offset = kHeaderBytes;
  for (const Span& array : arrays) {
    if (array.bytes > 0) std::memcpy(packet.get() + offset, array.data, array.bytes);
    offset += AlignUp(array.bytes);
  }
  return Push(ordinal, std::move(packet), size);
}

Status Hub::Push(int64_t ordinal, PacketPtr packet, int64_t size) {
  DeviceQueue* queue = Queue(ordinal);
  std::unique_lock<std::mutex> lock(queue->mu);
  // Over the bound, wait for the consumer; a lone packet always fits, so the
  // bytes waiting never exceed the bound plus one packet.
  while (queue->enqueued > queue->finished &&
         queue->bytes + size > max_bytes_.load(std::memory_order_acquire)) {
    if (stopped()) {
      return "host_callback: the receiver was stopped while device " +
             std::to_string(ordinal) +
             " waited for room in its full callback queue (see "
             "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE)";
    }
    ++queue->senders_waiting;
    queue->changed.wait_for(lock, kPollInterval);
    --queue->senders_waiting;
  }
  queue->waiting.push_back(std::move(packet));
  queue->bytes += size;
  if (queue->bytes > queue->high_water) queue->high_water = queue->bytes;
  ++queue->enqueued;
  queue->pushed.store(queue->enqueued, std::memory_order_release);
  if (queue->consumer_sleeping) queue->not_empty.notify_one();
  return Status();
}

Status Hub::Call(int64_t ordinal, int64_t site, const std::vector<Span>& arrays,
                 const std::vector<Span>& outputs) {
  ReplySlot slot;
  slot.outputs = outputs;
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_request_++;
    slots_[id] = &slot;
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.erase(id);  // from here on no replier can reach `slot`
  };
  if (Status status = Send(ordinal, site, id, arrays); !status.empty()) {
    forget();
    return status;
  }
  auto answered = [&] {
    return slot.state.load(std::memory_order_acquire) != kPending;
  };
  if (!Spin(kReplySpin, answered)) {
    while (!answered()) {
      {
        std::unique_lock<std::mutex> lock(slot.mu);
        slot.cv.wait_for(lock, kPollInterval,
                         [&] { return answered() || stopped(); });
      }
      if (!answered() && stopped()) break;
    }
  }
  forget();
  switch (slot.state.load(std::memory_order_acquire)) {
    case kDone:
      return Status();
    case kFailed:
      return slot.error;
    default:
      return "host_callback: the receiver was stopped while device " +
             std::to_string(ordinal) +
             " waited for the result of a host_callback.call";
  }
}

std::unique_ptr<Batch> Hub::Take(int64_t ordinal, double timeout_s,
                                 int64_t max_bytes) {
  DeviceQueue* queue = Queue(ordinal);
  std::unique_lock<std::mutex> lock(queue->mu);
  if (queue->waiting.empty()) {
    const int64_t seen = queue->enqueued;
    lock.unlock();
    Spin(kConsumerSpin, [&] {
      return queue->pushed.load(std::memory_order_acquire) != seen ||
             stopped();
    });
    lock.lock();
    queue->consumer_sleeping = true;
    queue->not_empty.wait_for(lock, Seconds(timeout_s), [&] {
      return !queue->waiting.empty() || stopped();
    });
    queue->consumer_sleeping = false;
    if (queue->waiting.empty()) return nullptr;
  }
  auto batch = std::make_unique<Batch>();
  batch->ordinal = ordinal;
  while (!queue->waiting.empty() &&
         (batch->packets.empty() || batch->bytes < max_bytes)) {
    PacketPtr& packet = queue->waiting.front();
    batch->bytes += reinterpret_cast<PacketHeader*>(packet.get())->size;
    batch->packets.push_back(std::move(packet));
    queue->waiting.pop_front();
  }
  return batch;
}

int64_t Hub::CopyBatch(const Batch& batch, uint8_t* dst, IndexEntry* index) {
  int64_t count = 0, offset = 0, dropped = 0, dropped_bytes = 0;
  for (const PacketPtr& packet : batch.packets) {
    const auto* header = reinterpret_cast<const PacketHeader*>(packet.get());
    if (header->request_id != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_.count(header->request_id) == 0) {
        // Its device gave up waiting (the receiver stopped): nobody to answer.
        ++dropped;
        dropped_bytes += header->size;
        continue;
      }
    }
    std::memcpy(dst + offset, packet.get(), header->size);
    index[count++] = IndexEntry{offset, header->site, header->request_id,
                                header->size};
    offset += header->size;
  }
  if (dropped > 0) Release(batch.ordinal, dropped, dropped_bytes);
  return count;
}

void Hub::Release(int64_t ordinal, int64_t packets, int64_t bytes) {
  DeviceQueue* queue = Queue(ordinal);
  std::lock_guard<std::mutex> lock(queue->mu);
  queue->finished += packets;
  queue->bytes -= bytes;
  queue->changed.notify_all();
}

bool Hub::WaitFinished(int64_t ordinal, int64_t target, double timeout_s) {
  DeviceQueue* queue = Queue(ordinal);
  std::unique_lock<std::mutex> lock(queue->mu);
  return queue->changed.wait_for(lock, Seconds(timeout_s), [&] {
    return queue->finished >= target;
  });
}

bool Hub::Finish(ReplySlot* slot, int state) {
  {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->state.store(state, std::memory_order_release);
  }
  slot->cv.notify_all();
  return true;
}

bool Hub::Reply(int64_t request_id, const std::vector<Span>& results,
                std::string* mismatch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return false;
  ReplySlot* slot = it->second;
  bool same = results.size() == slot->outputs.size();
  for (size_t i = 0; same && i < results.size(); ++i) {
    same = results[i].bytes == slot->outputs[i].bytes;
  }
  if (!same) {
    *mismatch = "host_callback: the host's result for a call does not match "
                "the sizes the device expects";
    slot->error = *mismatch;
    return Finish(slot, kFailed);
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].bytes > 0) {
      std::memcpy(slot->outputs[i].data, results[i].data, results[i].bytes);
    }
  }
  return Finish(slot, kDone);
}

bool Hub::ReplyError(int64_t request_id, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return false;
  it->second->error = message;
  return Finish(it->second, kFailed);
}

}  // namespace hcb
