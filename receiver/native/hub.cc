// The native core: see hub.h.

#include "hub.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
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
// A consumer takes taps at most this often, unless this many bytes wait
// (see DeviceQueue::consumer_pacing): the latency a tap may get.
constexpr auto kBatchInterval = std::chrono::milliseconds(2);
constexpr int64_t kHurryBytes = 1 << 20;
// Packets are written into chunks of this size (or one packet's size).
constexpr int64_t kChunkBytes = 1 << 20;
// Read chunks kept per device for reuse.
constexpr size_t kSpareChunks = 2;
// Blocks are mapped in multiples of kBlockGrain; those of at least a huge
// page start at a huge page boundary, with transparent huge pages asked for:
// a fault then maps 2 MiB instead of 4 KiB.
constexpr int64_t kHugePage = 2 << 20;
constexpr int64_t kBlockGrain = 64 << 10;
// The pool keeps free blocks up to the queue bound plus this many bytes.
constexpr int64_t kPoolSlack = 64 << 20;

// Under `queue->mu`: wakes its consumer if it sleeps on an empty queue, or
// if it paces itself and the queue is in a hurry.
void WakeConsumerFor(DeviceQueue* queue) {
  if (queue->consumer_idle || (queue->consumer_pacing && queue->hurry)) {
    queue->not_empty.notify_one();
  }
}

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

Status Failure(Code code, std::string message) {
  return Status{code, std::move(message)};
}

// Comparable with the `threading.main_thread().ident` Python passes in (a
// C-style cast, as pthread_t is an integer or a pointer by platform).
uint64_t ThisThread() { return (uint64_t)pthread_self(); }

// "[b0, b1, ...]" for `count` byte sizes, `bytes(i)` each.
template <typename Bytes>
std::string ByteSizes(size_t count, Bytes bytes) {
  std::string text = "[";
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(bytes(i));
  }
  return text + "]";
}

int64_t RoundUp(int64_t n, int64_t grain) { return (n + grain - 1) / grain * grain; }

int64_t BlockCapacity(int64_t bytes) { return RoundUp(bytes, kBlockGrain); }

void Unmap(Block* block) noexcept {
  munmap(block->data, static_cast<size_t>(block->capacity));
  delete block;
}

// New pages for a block of `capacity` bytes (from BlockCapacity).
Block* Map(int64_t capacity) {
  const bool huge = capacity >= kHugePage;
  const size_t mapped = static_cast<size_t>(capacity + (huge ? kHugePage : 0));
  void* at = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) throw std::bad_alloc();
  uint8_t* data = static_cast<uint8_t*>(at);
  if (huge) {  // keep the huge-page-aligned part
    const uintptr_t address = reinterpret_cast<uintptr_t>(at);
    const size_t head = RoundUp(static_cast<int64_t>(address), kHugePage) -
                        static_cast<int64_t>(address);
    if (head > 0) munmap(at, head);
    const size_t tail = mapped - head - static_cast<size_t>(capacity);
    if (tail > 0) munmap(data + head + capacity, tail);
    data += head;
#ifdef MADV_HUGEPAGE
    madvise(data, static_cast<size_t>(capacity), MADV_HUGEPAGE);
#endif
  }
  Block* block = new (std::nothrow) Block{data, capacity};
  if (block == nullptr) {
    munmap(data, static_cast<size_t>(capacity));
    throw std::bad_alloc();
  }
  return block;
}

}  // namespace

Chunk::~Chunk() {
  if (block != nullptr) Hub::Get().ReturnBlock(block);
}

Block* Hub::AcquireBlock(int64_t bytes) {
  const int64_t capacity = BlockCapacity(bytes);
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    // The smallest free block that fits and wastes at most half of itself.
    auto best = free_blocks_.end();
    for (auto it = free_blocks_.begin(); it != free_blocks_.end(); ++it) {
      const int64_t have = (*it)->capacity;
      if (have >= capacity && have <= 2 * capacity &&
          (best == free_blocks_.end() || have < (*best)->capacity)) {
        best = it;
      }
    }
    if (best != free_blocks_.end()) {
      Block* block = *best;
      free_blocks_.erase(best);
      free_bytes_ -= block->capacity;
      ++blocks_out_;
      return block;
    }
  }
  Block* block = Map(capacity);
  std::lock_guard<std::mutex> lock(pool_mu_);
  ++blocks_out_;
  mapped_bytes_ += capacity;
  return block;
}

void Hub::ReturnBlock(Block* block) noexcept {
  const int64_t limit = max_bytes_.load(std::memory_order_acquire) + kPoolSlack;
  std::unique_lock<std::mutex> lock(pool_mu_);
  --blocks_out_;
  while (true) {
    Block* unmapped = nullptr;
    if (block->capacity > limit) {
      unmapped = block;
      block = nullptr;
    } else if (free_bytes_ + block->capacity <= limit) {
      try {
        free_blocks_.push_back(block);
        free_bytes_ += block->capacity;
        return;
      } catch (const std::bad_alloc&) {
        unmapped = block;  // reuse is optional
        block = nullptr;
      }
    } else {  // make room: the oldest free block goes first
      unmapped = free_blocks_.front();
      free_blocks_.pop_front();
      free_bytes_ -= unmapped->capacity;
    }
    mapped_bytes_ -= unmapped->capacity;
    lock.unlock();
    Unmap(unmapped);
    if (block == nullptr) return;
    lock.lock();
  }
}

void Hub::PoolStats(int64_t* out) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  out[0] = free_bytes_;
  out[1] = static_cast<int64_t>(free_blocks_.size());
  out[2] = blocks_out_;
  out[3] = mapped_bytes_;
}

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

void Hub::SetNestedConsumer(NestedConsumer consumer) {
  nested_consumer_.store(consumer, std::memory_order_seq_cst);
}

void Hub::SetInterruptHook(InterruptHook hook, Rearm rearm,
                           uint64_t main_thread) {
  main_thread_.store(main_thread, std::memory_order_seq_cst);
  rearm_.store(rearm, std::memory_order_seq_cst);
  interrupt_hook_.store(hook, std::memory_order_seq_cst);
}

bool Hub::OnMainThread() {
  return ThisThread() == main_thread_.load(std::memory_order_seq_cst);
}

bool Hub::Interrupted() {
  InterruptHook hook = interrupt_hook_.load(std::memory_order_seq_cst);
  if (hook == nullptr || !OnMainThread() || hook() == 0) return false;
  RearmOnMainThread();
  return true;
}

void Hub::RearmOnMainThread() {
  if (!OnMainThread()) return;
  if (Rearm rearm = rearm_.load(std::memory_order_seq_cst)) rearm();
}

void Hub::RegisterSite(int64_t site, std::vector<int64_t> array_bytes) {
  std::unique_lock<std::shared_mutex> lock(sites_mu_);
  sites_[site] = std::move(array_bytes);
}

bool Hub::UnregisterSite(int64_t site) {
  std::unique_lock<std::shared_mutex> lock(sites_mu_);
  return sites_.erase(site) > 0;
}

Status Hub::CheckSite(int64_t site, const Span* arrays, size_t num_arrays) {
  std::shared_lock<std::shared_mutex> lock(sites_mu_);
  auto it = sites_.find(site);
  if (it == sites_.end()) {
    return Failure(Code::kNotFound,
                   "host_callback: callback site " + std::to_string(site) +
                       " is not registered (its host function was "
                       "garbage-collected?)");
  }
  const std::vector<int64_t>& expected = it->second;
  bool same = expected.size() == num_arrays;
  for (size_t i = 0; same && i < num_arrays; ++i) {
    same = expected[i] == arrays[i].bytes;
  }
  if (same) return Status();
  return Failure(
      Code::kInvalidArgument,
      "host_callback: callback site " + std::to_string(site) +
          " expects arrays of " +
          ByteSizes(expected.size(), [&](size_t i) { return expected[i]; }) +
          " bytes, but the device has " +
          ByteSizes(num_arrays, [&](size_t i) { return arrays[i].bytes; }) +
          " (host_callback lays out one of their dtypes unlike XLA; "
          "please report it)");
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

bool Hub::IsConsumer(DeviceQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mu);
  return queue->consumer == std::this_thread::get_id();
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
  if (queue->unread > 0) {
    queue->hurry = true;
    WakeConsumerFor(queue);
  }
}

Status Hub::EnsureReceiver(int64_t device_id) {
  if (attached_.load(std::memory_order_seq_cst)) return Status();
  RestartHook hook = restart_hook_.load(std::memory_order_seq_cst);
  if (hook != nullptr && hook() == 0) return Status();
  return Failure(Code::kUnavailable,
                 "host_callback: device " + std::to_string(device_id) +
                     " needs the host_callback receiver, which is stopped "
                     "and cannot start again (the interpreter is exiting?)");
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
    if (back->block == nullptr && back->capacity - back->used >= size) {
      return back;
    }
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
  if (Status status = CheckSite(site, arrays, num_arrays); !status.ok()) {
    return status;
  }
  return Push(device_id, site, request_id, arrays, num_arrays);
}

Status Hub::Push(int64_t device_id, int64_t site, int64_t request_id,
                 const Span* arrays, size_t num_arrays) {
  int64_t size = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) size += AlignUp(arrays[i].bytes);
  if (Status status = EnsureReceiver(device_id); !status.ok()) return status;
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock = LockSoon(queue->mu);
  // Over the bound, wait for the consumer; a lone packet always fits, so the
  // bytes waiting never exceed the bound plus one packet.
  while (queue->enqueued > queue->finished &&
         queue->bytes + size > max_bytes_.load(std::memory_order_acquire)) {
    if (!attached_.load(std::memory_order_seq_cst)) {
      lock.unlock();
      if (Status status = EnsureReceiver(device_id); !status.ok()) {
        status.message += " while it waited for room in its full callback "
                          "queue (see JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE)";
        return status;
      }
      lock.lock();
      continue;
    }
    queue->not_empty.notify_one();  // the consumer frees the room
    queue->changed.wait_for(lock, kPollInterval);
    lock.unlock();  // the hook runs Python
    const bool interrupted = Interrupted();
    lock.lock();
    if (interrupted) {
      return Failure(Code::kCancelled,
                     "host_callback: interrupted (KeyboardInterrupt) while "
                     "the device waited for room in its full callback queue");
    }
  }
  if (size >= kLargePacket) {
    return PushLarge(device_id, queue, lock, size, site, request_id, arrays,
                     num_arrays);
  }
  Chunk* chunk = ChunkWithRoom(queue, size);
  uint8_t* packet = chunk->begin() + chunk->used;
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
  if (request_id != 0 || queue->unread >= kHurryBytes ||
      queue->finish_waiters > 0) {
    queue->hurry = true;
  }
  WakeConsumerFor(queue);
  lock.unlock();
  // A receiver that detached while we pushed may have missed this packet.
  return EnsureReceiver(device_id);
}

namespace {

// Writes a packet (header, then each array at its aligned offset) at `at`.
void WritePacket(uint8_t* at, int64_t size, int64_t site, int64_t request_id,
                 const Span* arrays, size_t num_arrays) {
  const PacketHeader header{size, site, request_id, {}};
  std::memcpy(at, &header, sizeof(header));
  int64_t offset = kHeaderBytes;
  for (size_t i = 0; i < num_arrays; ++i) {
    if (arrays[i].bytes > 0) {
      std::memcpy(at + offset, arrays[i].data, arrays[i].bytes);
    }
    offset += AlignUp(arrays[i].bytes);
  }
}

}  // namespace

Status Hub::PushLarge(int64_t device_id, DeviceQueue* queue, std::unique_lock<std::mutex>& lock,
                      int64_t size, int64_t site, int64_t request_id,
                      const Span* arrays, size_t num_arrays) {
  // Reserved first: the packet counts in the bound, and as sent for
  // barriers and direct runs, while it is copied without the lock.
  queue->bytes += size;
  queue->high_water = std::max(queue->high_water, queue->bytes);
  ++queue->enqueued;
  lock.unlock();
  try {
    std::unique_ptr<Chunk> chunk;
    {
      Block* block = AcquireBlock(size);
      try {
        chunk = std::make_unique<Chunk>(block);
      } catch (...) {
        ReturnBlock(block);
        throw;
      }
    }
    WritePacket(chunk->block->data, size, site, request_id, arrays,
                num_arrays);
    chunk->used = size;
    lock.lock();
    queue->chunks.push_back(std::move(chunk));  // else ~Chunk returns it
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    queue->bytes -= size;  // as if consumed at once
    ++queue->finished;
    queue->changed.notify_all();
    throw;
  }
  queue->unread += size;
  queue->pushed.store(queue->enqueued, std::memory_order_release);
  queue->hurry = true;  // its block is lent to the consumer, not copied
  WakeConsumerFor(queue);
  lock.unlock();
  return EnsureReceiver(device_id);
}

bool Hub::RunDirect(DirectRunner runner, DeviceQueue* queue,
                    const DirectRequest& request, Status* status) {
  if (!BeginDirect(queue)) return false;
  struct End {
    Hub* hub;
    DeviceQueue* queue;
    ~End() { hub->EndDirect(queue); }
  } end{this, queue};
  std::string error;
  switch (runner(request, &error)) {
    case DirectOutcome::kDone:
      *status = Status();
      return true;
    case DirectOutcome::kFailed:
      *status = Failure(Code::kInternal, std::move(error));
      return true;
    case DirectOutcome::kInterrupted:
      RearmOnMainThread();
      *status = Failure(Code::kCancelled, std::move(error));
      return true;
    case DirectOutcome::kDeclined:
      break;
  }
  return false;
}

// A request's reply slot, in `slots_` from construction until its device
// stops waiting; the destructor waits for a replier that claimed it.
class Hub::PendingRequest {
 public:
  PendingRequest(Hub* hub, const Span* outputs, size_t num_outputs)
      : hub_(hub) {
    slot_.outputs = outputs;
    slot_.num_outputs = num_outputs;
    std::lock_guard<std::mutex> lock(hub->mu_);
    id_ = hub->next_request_++;
    hub->slots_[id_] = &slot_;
  }
  PendingRequest(const PendingRequest&) = delete;
  PendingRequest& operator=(const PendingRequest&) = delete;

  ~PendingRequest() {
    bool claimed;
    {
      std::lock_guard<std::mutex> lock(hub_->mu_);
      claimed = hub_->slots_.erase(id_) == 0;
    }
    if (claimed) {  // its replier finishes it (under `slot_.mu`) soon
      std::unique_lock<std::mutex> lock(slot_.mu);
      slot_.cv.wait(lock, [&] { return answered(); });
    }
  }

  int64_t id() const { return id_; }

  bool Answered() const { return answered(); }

  // Waits for the reply; gives up on Ctrl-C or when no receiver can answer.
  Status Wait(int64_t device_id) {
    auto answered = [&] { return this->answered(); };
    if (!Spin(kReplySpin, answered)) {
      while (!answered()) {
        {
          std::unique_lock<std::mutex> lock(slot_.mu);
          slot_.cv.wait_for(lock, kPollInterval, answered);
        }
        if (answered()) break;
        if (hub_->Interrupted()) {
          return Failure(Code::kCancelled,
                         "host_callback: interrupted (KeyboardInterrupt) "
                         "while the device waited for a host function");
        }
        if (Status status = hub_->EnsureReceiver(device_id); !status.ok()) {
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

 private:
  bool answered() const {
    return slot_.state.load(std::memory_order_acquire) != kPending;
  }

  Hub* hub_;
  ReplySlot slot_;
  int64_t id_ = 0;
};

Status Hub::Call(int64_t device_id, int64_t site, const Span* arrays,
                 size_t num_arrays, const Span* outputs, size_t num_outputs) {
  if (Status status = CheckSite(site, arrays, num_arrays); !status.ok()) {
    return status;
  }
  DirectRunner runner = direct_runner_.load(std::memory_order_seq_cst);
  DeviceQueue* queue = Queue(device_id);
  Status direct;
  if (runner != nullptr &&
      RunDirect(runner, queue,
                DirectRequest{device_id, site, arrays, num_arrays, outputs,
                              num_outputs},
                &direct)) {
    return direct;
  }
  if (IsConsumer(queue)) {
    if (NestedConsumer consume =
            nested_consumer_.load(std::memory_order_seq_cst)) {
      // This thread consumes the device's queue: it serves the request
      // itself, after what the device sent before it.
      PendingRequest request(this, outputs, num_outputs);
      if (Status status =
              Push(device_id, site, request.id(), arrays, num_arrays);
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
    return Failure(
        Code::kFailedPrecondition,
        "host_callback: a call (or synchronous tap) made from inside a host "
        "function that the receiver thread of device " +
            std::to_string(device_id) +
            " runs cannot be served: the receiver has shut down");
  }
  struct Suspension {  // lets the consumer answer a nested request
    Hub* hub;
    DeviceQueue* queue;
    bool active;
    ~Suspension() {
      if (active) hub->ResumeDirect(queue);
    }
  } suspension{this, queue, SuspendDirect(queue)};
  PendingRequest request(this, outputs, num_outputs);
  if (Status status = Push(device_id, site, request.id(), arrays, num_arrays);
      !status.ok()) {
    return status;
  }
  return request.Wait(device_id);
}

int64_t Hub::Take(int64_t device_id, double timeout_s, uint8_t* dst,
                  int64_t capacity, IndexEntry* index, int64_t max_packets,
                  int64_t* needed) {
  *needed = 0;
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock = LockSoon(queue->mu);
  queue->consumer = std::thread::id();  // done with its last batch
  const int64_t generation = wake_generation_.load(std::memory_order_seq_cst);
  auto woken = [&] {
    return wake_generation_.load(std::memory_order_seq_cst) != generation;
  };
  auto ready = [&] { return queue->unread > 0 && !queue->direct_busy; };
  const auto deadline = Clock::now() + Seconds(timeout_s);
  if (!ready()) {
    if (queue->expect_request) {
      const int64_t seen = queue->enqueued;
      lock.unlock();
      Spin(kConsumerSpin, [&] {
        return queue->pushed.load(std::memory_order_acquire) != seen ||
               woken();
      });
      lock.lock();
    }
    queue->consumer_idle = true;
    queue->not_empty.wait_until(lock, deadline,
                                [&] { return ready() || woken(); });
    queue->consumer_idle = false;
    if (!ready()) return 0;
  }
  if (!queue->hurry) {
    queue->consumer_pacing = true;
    queue->not_empty.wait_until(
        lock, std::min(deadline, queue->last_take + kBatchInterval),
        [&] { return queue->hurry || woken(); });
    queue->consumer_pacing = false;
    if (!ready()) return 0;
  }
  queue->last_take = Clock::now();
  // Under the lock, only find the byte ranges of whole small packets, and
  // take the blocks of large ones: the device no longer touches them, so
  // the small ones are copied after unlocking, and the blocks are lent.
  struct Piece {
    const uint8_t* begin;
    int64_t bytes;
    Block* block;  // a large packet's, else null
  };
  // Allocated before anything changes: nothing below throws.
  std::vector<Piece> pieces;
  std::vector<std::unique_ptr<Chunk>> retired;  // read to their end
  pieces.reserve(queue->chunks.size());
  retired.reserve(queue->chunks.size());
  int64_t bytes = 0, packets = 0;
  while (packets < max_packets && !queue->chunks.empty()) {
    Chunk* chunk = queue->chunks.front().get();
    if (chunk->block != nullptr) {  // a large packet, complete once queued
      pieces.push_back({chunk->block->data, chunk->used, chunk->block});
      chunk->block = nullptr;
      queue->unread -= chunk->used;
      ++packets;
      retired.push_back(std::move(queue->chunks.front()));
      queue->chunks.pop_front();
      continue;
    }
    const int64_t begin = queue->read_offset;
    while (queue->read_offset < chunk->used && packets < max_packets) {
      const int64_t size =
          ReadHeader(chunk->begin() + queue->read_offset).size;
      if (bytes + size > capacity) {
        if (packets == 0) *needed = size;
        break;
      }
      queue->read_offset += size;
      bytes += size;
      ++packets;
    }
    if (queue->read_offset > begin) {
      pieces.push_back({chunk->begin() + begin, queue->read_offset - begin,
                        nullptr});
      queue->unread -= queue->read_offset - begin;
    }
    // Stop in a chunk not read to its end, or where the device still writes.
    if (queue->read_offset < chunk->used || queue->chunks.size() == 1) break;
    retired.push_back(std::move(queue->chunks.front()));
    queue->chunks.pop_front();
    queue->read_offset = 0;
  }
  if (packets > 0) queue->consumer = std::this_thread::get_id();
  queue->hurry = queue->unread > 0;  // a backlog: the next batch at once
  lock.unlock();

  // Its device gave up waiting for a call: nobody to answer.
  auto live = [&](const PacketHeader& header) {
    if (header.request_id == 0) return true;
    std::lock_guard<std::mutex> slots_lock(mu_);
    return slots_.count(header.request_id) > 0;
  };
  int64_t count = 0, dropped = 0, dropped_bytes = 0, offset = 0;
  bool requests = false;
  for (const Piece& piece : pieces) {
    if (piece.block != nullptr) {
      const PacketHeader header = ReadHeader(piece.begin);
      requests |= header.request_id != 0;
      if (live(header)) {
        index[count++] = IndexEntry{
            0, header.site, header.request_id, header.size,
            reinterpret_cast<int64_t>(piece.block),
            reinterpret_cast<int64_t>(piece.block->data)};
      } else {
        ReturnBlock(piece.block);
        ++dropped;
        dropped_bytes += header.size;
      }
      continue;
    }
    std::memcpy(dst + offset, piece.begin, piece.bytes);
    for (const int64_t end = offset + piece.bytes; offset < end;) {
      const PacketHeader header = ReadHeader(dst + offset);
      requests |= header.request_id != 0;
      if (live(header)) {
        index[count++] = IndexEntry{offset, header.site, header.request_id,
                                    header.size, 0, 0};
      } else {
        ++dropped;
        dropped_bytes += header.size;
      }
      offset += header.size;
    }
  }
  lock.lock();
  queue->expect_request = requests;
  if (dropped > 0) {
    queue->finished += dropped;
    queue->bytes -= dropped_bytes;
    queue->changed.notify_all();
  }
  for (std::unique_ptr<Chunk>& chunk : retired) {
    if (queue->spare.size() < kSpareChunks && chunk->data != nullptr &&
        chunk->capacity == kChunkBytes) {
      chunk->used = 0;
      try {
        queue->spare.push_back(std::move(chunk));
      } catch (const std::bad_alloc&) {
        break;  // reuse is optional; `retired` frees the rest
      }
    }
  }
  return count;
}

void Hub::Release(int64_t device_id, int64_t packets, int64_t bytes) {
  DeviceQueue* queue = Queue(device_id);
  std::lock_guard<std::mutex> lock(queue->mu);
  queue->finished += packets;
  queue->bytes -= bytes;
  if (queue->consumer == std::this_thread::get_id()) {
    queue->consumer = std::thread::id();
  }
  queue->changed.notify_all();
}

bool Hub::WaitFinished(int64_t device_id, int64_t target, double timeout_s) {
  DeviceQueue* queue = Queue(device_id);
  std::unique_lock<std::mutex> lock(queue->mu);
  ++queue->finish_waiters;  // packets pushed meanwhile hurry the consumer
  if (queue->unread > 0) {
    queue->hurry = true;
    WakeConsumerFor(queue);
  }
  const bool finished = queue->changed.wait_for(
      lock, Seconds(timeout_s), [&] { return queue->finished >= target; });
  --queue->finish_waiters;
  return finished;
}

void Hub::Finish(ReplySlot* slot, int state) {
  // Notified under the lock: the slot's device may free it once it holds it.
  std::lock_guard<std::mutex> lock(slot->mu);
  slot->state.store(state, std::memory_order_release);
  slot->cv.notify_all();
}

ReplySlot* Hub::Claim(int64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return nullptr;
  ReplySlot* slot = it->second;
  slots_.erase(it);
  return slot;
}

ReplyOutcome Hub::Reply(int64_t request_id, const Span* results,
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
      message =
          "host_callback: the host's result for a call has arrays of " +
          ByteSizes(num_results, [&](size_t i) { return results[i].bytes; }) +
          " bytes where the device expects " +
          ByteSizes(slot->num_outputs,
                    [&](size_t i) { return slot->outputs[i].bytes; });
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

bool Hub::ReplyError(int64_t request_id, std::string message) {
  ReplySlot* slot = Claim(request_id);
  if (slot == nullptr) return false;
  slot->error.swap(message);
  Finish(slot, kFailed);
  return true;
}

}  // namespace hcb
