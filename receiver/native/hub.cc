// The native core: see hub.h.

#include "hub.h"

#include <algorithm>
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
// futex wake-up costs more than a packet.
constexpr auto kConsumerSpin = std::chrono::microseconds(20);
constexpr auto kReplySpin = std::chrono::microseconds(50);
// A sleeping consumer is woken by a tap only this often, or when this many
// bytes wait (see DeviceQueue::last_wake).
constexpr auto kWakeInterval = std::chrono::milliseconds(2);
constexpr int64_t kWakeBytes = 1 << 20;
// Packets are written into chunks of this size (or one packet's size).
constexpr int64_t kChunkBytes = 1 << 20;
// Read chunks kept per device for reuse.
constexpr size_t kSpareChunks = 2;

inline void Relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done()` for up to `budget`; true if it became true. Pauses between
// polls keep the polled cache line with its writer.
template <typename Done>
bool Spin(std::chrono::microseconds budget, Done done) {
  const auto deadline = Clock::now() + budget;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 7) == 7 && Clock::now() >= deadline) return false;
    for (int j = 0; j < 4; ++j) Relax();
  }
}

// Locks `mu`, first polling it briefly: the other side holds it for well
// under a microsecond, far less than sleeping on it costs.
std::unique_lock<std::mutex> LockSoon(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
  for (int i = 0; i < 256 && !lock.owns_lock(); ++i) {
    Relax();
    lock.try_lock();
  }
  if (!lock.owns_lock()) lock.lock();
  return lock;
}

std::chrono::microseconds Seconds(double s) {
  return std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

PacketHeader ReadHeader(const uint8_t* at) {
  PacketHeader header;
  std::memcpy(&header, at, sizeof(header));
  return header;
}

}  // namespace

Hub& Hub::Get() {
  static Hub* hub = new Hub();  // never destroyed: device threads may outlive exit
  return *hub;
}

void Hub::Attach(int64_t max_bytes) {
  max_bytes_.store(max_bytes, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device_id, queue] : queues_) {
    std::lock_guard<std::mutex> queue_lock(queue->mu);
    queue->high_water = queue->bytes;  // statistics start with the receiver
  }
  attached_.store(true, std::memory_order_seq_cst);
}

bool Hub::Detach() {
  // A device that pushes after this store sees it and calls the hook; one
  // that pushed before is seen below. Either way its packet is not orphaned.
  attached_.store(false, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> lock(mu_);
  bool pending = !slots_.empty();
  for (auto& [device_id, queue] : queues_) {
    std::lock_guard<std::mutex> queue_lock(queue->mu);
    pending = pending || queue->unread > 0;
    queue->changed.notify_all();
  }
  return pending;
}

void Hub::SetRestartHook(RestartHook hook) {
  restart_hook_.store(hook, std::memory_order_seq_cst);
  if (hook != nullptr) return;
  // Wake the devices that wait, so that they fail instead.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device_id, queue] : queues_) {
    std::lock_guard<std::mutex> queue_lock(queue->mu);
    queue->changed.notify_all();
  }
  for (auto& [id, slot] : slots_) {
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    slot->cv.notify_all();
  }
}

void Hub::WakeConsumers() {
  wake_generation_.fetch_add(1, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device_id, queue] : queues_) {
    std::lock_guard<std::mutex> queue_lock(queue->mu);
    queue->not_empty.notify_all();
  }
}

void Hub::SetDirectRunner(DirectRunner runner) {
  direct_runner_.store(runner, std::memory_order_seq_cst);
}

bool Hub::BeginDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  const std::thread::id me = std::this_thread::get_id();
  if (queue->direct_depth > 0 && queue->direct_owner != me) return false;
  // Finished counts lag until the consumer's next Take: a consumer between
  // batches still counts as busy, so order with queued packets holds.
  if (queue->enqueued != queue->finished) return false;
  if (queue->direct_depth++ == 0) queue->direct_owner = me;
  queue->direct_busy = true;
  return true;
}

bool Hub::SuspendDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  if (queue->direct_depth == 0 ||
      queue->direct_owner != std::this_thread::get_id() ||
      !queue->direct_busy) {
    return false;
  }
  queue->direct_busy = false;
  queue->not_empty.notify_all();
  return true;
}

void Hub::ResumeDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  queue->direct_busy = true;
}

void Hub::EndDirect(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  if (--queue->direct_depth > 0) return;
  queue->direct_busy = false;
  // Wake the consumer only for packets that arrived meanwhile.
  if (queue->unread > 0 && queue->consumer_sleeping) {
    queue->not_empty.notify_all();
  }
}

Status Hub::EnsureReceiver(int64_t device_id) {
  if (attached_.load(std::memory_order_seq_cst)) return Status();
  RestartHook hook = restart_hook_.load(std::memory_order_seq_cst);
  if (hook != nullptr && hook() == 0) return Status();
  return "host_callback: device " + std::to_string(device_id) +
         " needs the host_callback receiver, which is stopped and cannot "
         "start again (the interpreter is exiting?)";
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
    entry = std::make_unique<DeviceQueue>();
    if (fast) fast_[device_id].store(entry.get(), std::memory_order_release);
  }
  return entry.get();
}

Chunk* Hub::ChunkWithRoom(DeviceQueue* queue, int64_t size) {
  if (!queue->chunks.empty()) {
    Chunk* back = queue->chunks.back().get();
    if (back->capacity - back->used >= size) return back;
  }
  std::unique_ptr<Chunk> chunk;
  if (!queue->spare.empty() && size <= kChunkBytes) {
    chunk = std::move(queue->spare.back());
    queue->spare.pop_back();
  } else {
    chunk = std::make_unique<Chunk>(std::max(kChunkBytes, size));
  }
  queue->chunks.push_back(std::move(chunk));
  return queue->chunks.back().get();
}

Status Hub::Send(int64_t device_id, int64_t site, int64_t request_id,
                 const Span* arrays, size_t num_arrays) {
  int64_t size = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) size += AlignUp(arrays[i].bytes);
  if (Status status = EnsureReceiver(device_id); !status.empty()) return status;
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock = LockSoon(queue->mu);
  // Over the bound, wait for the consumer; a lone packet always fits, so the
  // bytes waiting never exceed the bound plus one packet.
  while (queue->enqueued > queue->finished &&
         queue->bytes + size > max_bytes_.load(std::memory_order_acquire)) {
    if (!attached_.load(std::memory_order_seq_cst)) {
      lock.unlock();
      if (Status status = EnsureReceiver(device_id); !status.empty()) {
        return status + " while it waited for room in its full callback "
                        "queue (see JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE)";
      }
      lock.lock();
      continue;
    }
    queue->not_empty.notify_one();  // the consumer frees the room
    queue->changed.wait_for(lock, kPollInterval);
  }
  Chunk* chunk = ChunkWithRoom(queue, size);
  uint8_t* packet = chunk->data.get() + chunk->used;
  const PacketHeader header{size, site, request_id, {}};
  std::memcpy(packet, &header, sizeof(header));
  int64_t offset = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) {
    if (arrays[i].bytes > 0) {
      std::memcpy(packet + offset, arrays[i].data, arrays[i].bytes);
    }
    offset += AlignUp(arrays[i].bytes);
  }
  chunk->used += size;
  queue->unread += size;
  queue->bytes += size;
  queue->high_water = std::max(queue->high_water, queue->bytes);
  ++queue->enqueued;
  queue->pushed.store(queue->enqueued, std::memory_order_release);
  if (queue->consumer_sleeping) {
    const auto now = Clock::now();
    if (request_id != 0 || queue->unread >= kWakeBytes ||
        now - queue->last_wake >= kWakeInterval) {
      queue->last_wake = now;
      queue->not_empty.notify_one();
    }
  }
  lock.unlock();
  // A receiver that detached while we pushed may have missed this packet.
  return EnsureReceiver(device_id);
}

Status Hub::Call(int64_t device_id, int64_t site, const Span* arrays,
                 size_t num_arrays, const Span* outputs, size_t num_outputs) {
  DirectRunner runner = direct_runner_.load(std::memory_order_seq_cst);
  DeviceQueue* queue = Queue(device_id);
  if (runner != nullptr && BeginDirect(queue)) {
    std::vector<void*> args(num_arrays), results(num_outputs);
    std::vector<int64_t> arg_bytes(num_arrays), result_bytes(num_outputs);
    for (size_t i = 0; i < num_arrays; ++i) {
      args[i] = arrays[i].data;
      arg_bytes[i] = arrays[i].bytes;
    }
    for (size_t i = 0; i < num_outputs; ++i) {
      results[i] = outputs[i].data;
      result_bytes[i] = outputs[i].bytes;
    }
    char error[4096] = {0};
    const int done = runner(device_id, site, args.data(), arg_bytes.data(),
                            static_cast<int64_t>(num_arrays), results.data(),
                            result_bytes.data(),
                            static_cast<int64_t>(num_outputs), error,
                            sizeof(error) - 1);
    EndDirect(queue);
    if (done == 0) return Status();
    if (done == 1) return Status(error);
  }
  struct Suspension {  // lets the consumer answer a nested request
    Hub* hub;
    DeviceQueue* queue;
    bool active;
    ~Suspension() {
      if (active) hub->ResumeDirect(queue);
    }
  } suspension{this, queue, SuspendDirect(queue)};
  ReplySlot slot;
  slot.outputs = outputs;
  slot.num_outputs = num_outputs;
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
  if (Status status = Send(device_id, site, id, arrays, num_arrays);
      !status.empty()) {
    forget();
    return status;
  }
  auto answered = [&] {
    return slot.state.load(std::memory_order_acquire) != kPending;
  };
  Status receiver;
  if (!Spin(kReplySpin, answered)) {
    while (!answered()) {
      {
        std::unique_lock<std::mutex> lock(slot.mu);
        slot.cv.wait_for(lock, kPollInterval, answered);
      }
      if (!answered() && !(receiver = EnsureReceiver(device_id)).empty()) break;
    }
  }
  forget();
  switch (slot.state.load(std::memory_order_acquire)) {
    case kDone:
      return Status();
    case kFailed:
      return slot.error;
    default:
      return receiver + " while it waited for the result of a "
                        "host_callback.call";
  }
}

int64_t Hub::Take(int64_t device_id, double timeout_s, uint8_t* dst,
                  int64_t capacity, IndexEntry* index, int64_t max_packets,
                  int64_t* needed) {
  *needed = 0;
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock = LockSoon(queue->mu);
  if (queue->unread == 0 || queue->direct_busy) {
    const int64_t seen = queue->enqueued;
    const int64_t generation = wake_generation_.load(std::memory_order_seq_cst);
    auto woken = [&] {
      return wake_generation_.load(std::memory_order_seq_cst) != generation;
    };
    lock.unlock();
    Spin(kConsumerSpin, [&] {
      return queue->pushed.load(std::memory_order_acquire) != seen || woken();
    });
    lock.lock();
    queue->consumer_sleeping = true;
    queue->not_empty.wait_for(lock, Seconds(timeout_s), [&] {
      return (queue->unread > 0 && !queue->direct_busy) || woken();
    });
    queue->consumer_sleeping = false;
    if (queue->unread == 0 || queue->direct_busy) return 0;
  }
  // Under the lock, only find the byte ranges of whole packets: the device
  // no longer touches them, so they are copied after unlocking.
  struct Range {
    const uint8_t* begin;
    int64_t bytes;
  };
  std::vector<Range> ranges;
  std::vector<std::unique_ptr<Chunk>> retired;  // read to their end
  int64_t bytes = 0, packets = 0;
  while (packets < max_packets) {
    Chunk* chunk = queue->chunks.front().get();
    const int64_t begin = queue->read_offset;
    while (queue->read_offset < chunk->used && packets < max_packets) {
      const int64_t size =
          ReadHeader(chunk->data.get() + queue->read_offset).size;
      if (bytes + size > capacity) {
        if (packets == 0) *needed = size;
        break;
      }
      queue->read_offset += size;
      bytes += size;
      ++packets;
    }
    if (queue->read_offset > begin) {
      ranges.push_back({chunk->data.get() + begin, queue->read_offset - begin});
      queue->unread -= queue->read_offset - begin;
    }
    // Stop in a chunk not read to its end, or where the device still writes.
    if (queue->read_offset < chunk->used || queue->chunks.size() == 1) break;
    retired.push_back(std::move(queue->chunks.front()));
    queue->chunks.pop_front();
    queue->read_offset = 0;
  }
  lock.unlock();

  int64_t offset = 0;
  for (const Range& range : ranges) {
    std::memcpy(dst + offset, range.begin, range.bytes);
    offset += range.bytes;
  }
  int64_t count = 0, dropped = 0, dropped_bytes = 0;
  for (int64_t at = 0; at < bytes;) {
    const PacketHeader header = ReadHeader(dst + at);
    bool live = true;
    if (header.request_id != 0) {
      std::lock_guard<std::mutex> slots_lock(mu_);
      live = slots_.count(header.request_id) > 0;
    }
    if (live) {
      index[count++] = IndexEntry{at, header.site, header.request_id,
                                  header.size};
    } else {
      // Its device gave up waiting: nobody to answer.
      ++dropped;
      dropped_bytes += header.size;
    }
    at += header.size;
  }
  lock.lock();
  for (std::unique_ptr<Chunk>& chunk : retired) {
    if (queue->spare.size() < kSpareChunks && chunk->capacity == kChunkBytes) {
      chunk->used = 0;
      queue->spare.push_back(std::move(chunk));
    }
  }
  if (dropped > 0) {
    queue->finished += dropped;
    queue->bytes -= dropped_bytes;
    queue->changed.notify_all();
  }
  return count;
}

void Hub::Release(int64_t device_id, int64_t packets, int64_t bytes) {
  DeviceQueue* queue = Queue(device_id);
  std::lock_guard<std::mutex> lock(queue->mu);
  queue->finished += packets;
  queue->bytes -= bytes;
  queue->changed.notify_all();
}

bool Hub::WaitFinished(int64_t device_id, int64_t target, double timeout_s) {
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock(queue->mu);
  if (queue->unread > 0) queue->not_empty.notify_all();  // taps may not have
  return queue->changed.wait_for(lock, Seconds(timeout_s), [&] {
    return queue->finished >= target;
  });
}

void Hub::Finish(ReplySlot* slot, int state) {
  {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->state.store(state, std::memory_order_release);
  }
  slot->cv.notify_all();
}

bool Hub::Reply(int64_t request_id, const Span* results, size_t num_results,
                std::string* mismatch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return false;
  ReplySlot* slot = it->second;
  bool same = num_results == slot->num_outputs;
  for (size_t i = 0; same && i < num_results; ++i) {
    same = results[i].bytes == slot->outputs[i].bytes;
  }
  if (!same) {
    *mismatch = "host_callback: the host's result for a call does not have "
                "the sizes the device expects";
    slot->error = *mismatch;
    Finish(slot, kFailed);
    return true;
  }
  for (size_t i = 0; i < num_results; ++i) {
    if (results[i].bytes > 0) {
      std::memcpy(slot->outputs[i].data, results[i].data, results[i].bytes);
    }
  }
  Finish(slot, kDone);
  return true;
}

bool Hub::ReplyError(int64_t request_id, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return false;
  it->second->error = message;
  Finish(it->second, kFailed);
  return true;
}

}  // namespace hcb
