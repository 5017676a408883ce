// The packet queue of one device: see device_queue.h.

#include "device_queue.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "waits.h"

namespace hcb {
namespace {

// How long a consumer that expects a request soon polls before it sleeps.
constexpr auto kConsumerSpin = std::chrono::microseconds(20);
// A consumer takes taps at most this often, unless this many bytes wait
// (see DeviceQueue::consumer_pacing): the latency a tap may get.
constexpr auto kBatchInterval = std::chrono::milliseconds(2);
constexpr int64_t kHurryBytes = 1 << 20;
// Packets are written into chunks of this size (or one packet's size).
constexpr int64_t kChunkBytes = 1 << 20;
// Read chunks kept per device for reuse.
constexpr size_t kSpareChunks = 2;

}  // namespace

Chunk* DeviceQueue::ChunkWithRoom(int64_t size) {
  if (!chunks_.empty()) {
    Chunk* back = chunks_.back().get();
    if (back->block == nullptr && back->capacity - back->used >= size) {
      return back;
    }
  }
  std::unique_ptr<Chunk> chunk;
  if (!spare_.empty() && size <= kChunkBytes) {
    chunk = std::move(spare_.back());
    spare_.pop_back();
  } else {
    chunk = std::make_unique<Chunk>(std::max(kChunkBytes, size));
  }
  chunks_.push_back(std::move(chunk));
  return chunks_.back().get();
}

Status DeviceQueue::WaitForRoom(std::unique_lock<std::mutex>& lock,
                                int64_t size) {
  ReceiverLink* receiver = links_.receiver;
  // Over the bound, wait for the consumer; a lone packet always fits, so the
  // bytes waiting never exceed the bound plus one packet.
  while (enqueued_ > finished_ && bytes_ + size > receiver->queue_bound()) {
    if (!receiver->attached()) {
      lock.unlock();
      if (Status status = receiver->EnsureReceiver(device_id_); !status.ok()) {
        status.message += " while it waited for room in its full callback "
                          "queue (see JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE)";
        return status;
      }
      lock.lock();
      continue;
    }
    not_empty_.notify_one();  // the consumer frees the room
    changed_.wait_for(lock, kPollInterval);
    lock.unlock();  // the hook runs Python
    const bool interrupted = links_.interrupts->Interrupted();
    lock.lock();
    if (interrupted) {
      return links_.interrupts->Cancel(
          "while the device waited for room in its full callback queue");
    }
  }
  return Status();
}

Status DeviceQueue::LockWithRoom(int64_t size,
                                 std::unique_lock<std::mutex>* lock) {
  if (Status status = links_.receiver->EnsureReceiver(device_id_);
      !status.ok()) {
    return status;
  }
  *lock = LockSoon(mu_);
  return WaitForRoom(*lock, size);
}

void DeviceQueue::CountSent(int64_t size) {
  bytes_ += size;
  high_water_ = std::max(high_water_, bytes_);
  ++enqueued_;
}

void DeviceQueue::CountConsumedAtOnce(int64_t size) {
  bytes_ -= size;
  ++finished_;
  changed_.notify_all();
}

void DeviceQueue::PublishBlock(int64_t size) {
  unread_ += size;
  pushed_.store(enqueued_, std::memory_order_release);
  hurry_ = true;
  WakeConsumer();
}

Status DeviceQueue::Push(int64_t site, int64_t request_id, const Span* arrays,
                         size_t num_arrays) {
  const int64_t size = PacketSize(arrays, num_arrays);
  std::unique_lock<std::mutex> lock;
  if (Status status = LockWithRoom(size, &lock); !status.ok()) return status;
  if (size >= kLargePacket) {
    return PushLarge(lock, size, site, request_id, arrays, num_arrays);
  }
  Chunk* chunk = ChunkWithRoom(size);
  WritePacket(chunk->begin() + chunk->used, size, site, request_id, arrays,
              num_arrays);
  chunk->used += size;
  unread_ += size;
  CountSent(size);
  pushed_.store(enqueued_, std::memory_order_release);
  if (request_id != 0 || unread_ >= kHurryBytes || finish_waiters_ > 0) {
    hurry_ = true;
  }
  WakeConsumer();
  lock.unlock();
  // A receiver that detached while we pushed may have missed this packet.
  return links_.receiver->EnsureReceiver(device_id_);
}

Status DeviceQueue::PushLarge(std::unique_lock<std::mutex>& lock, int64_t size,
                              int64_t site, int64_t request_id,
                              const Span* arrays, size_t num_arrays) {
  // Reserved first: the packet counts while it is copied without the lock.
  CountSent(size);
  lock.unlock();
  try {
    std::unique_ptr<Chunk> chunk;
    {
      Block* block = links_.pool->Acquire(size);
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
    chunks_.push_back(std::move(chunk));  // else ~Chunk returns it
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    CountConsumedAtOnce(size);
    throw;
  }
  PublishBlock(size);
  lock.unlock();
  return links_.receiver->EnsureReceiver(device_id_);
}

int64_t DeviceQueue::Take(double timeout_s, uint8_t* dst, int64_t capacity,
                          IndexEntry* index, int64_t max_packets,
                          int64_t* needed) {
  *needed = 0;
  ReceiverLink* receiver = links_.receiver;
  std::unique_lock<std::mutex> lock = LockSoon(mu_);
  const int64_t generation = receiver->wake_generation();
  auto woken = [&] { return receiver->wake_generation() != generation; };
  // While a claim is active, only a consumer that holds packets takes (a
  // nested take: a claim's owner that resumes waits for it).
  auto ready = [&] {
    return unread_ > 0 && (!claim_active_ || ConsumingHere());
  };
  const auto deadline = Clock::now() + Seconds(timeout_s);
  auto pace_until = last_take_ + kBatchInterval;
  if (!ready() && expect_request_) {
    const int64_t seen = enqueued_;
    lock.unlock();
    Spin(kConsumerSpin, [&] {
      return pushed_.load(std::memory_order_acquire) != seen || woken();
    });
    lock.lock();
  }
  while (true) {
    if (!ready()) {
      consumer_idle_ = true;
      not_empty_.wait_until(lock, deadline, [&] { return ready() || woken(); });
      consumer_idle_ = false;
      if (!ready()) return 0;
      // Woken for taps: a barrier that waits for them may consume them on
      // its own thread (TakeAsGuest) sooner than this thread could hand
      // them back.
      pace_until = std::max(pace_until, Clock::now() + kGuestGrace);
    }
    if (hurry_) break;
    consumer_pacing_ = true;
    not_empty_.wait_until(lock, std::min(deadline, pace_until),
                          [&] { return hurry_ || woken(); });
    consumer_pacing_ = false;
    if (ready()) break;
    if (woken() || Clock::now() >= deadline) return 0;
    // A guest took the taps meanwhile: wait for the next ones here rather
    // than return empty-handed to the Python receiver, which would take
    // the GIL at every step of a loop that calls barrier_wait.
  }
  last_take_ = Clock::now();
  return TakeWaiting(lock, dst, capacity, index, max_packets, needed,
                     /*by_consumer=*/true);
}

int64_t DeviceQueue::TakeWaiting(std::unique_lock<std::mutex>& lock,
                                 uint8_t* dst, int64_t capacity,
                                 IndexEntry* index, int64_t max_packets,
                                 int64_t* needed, bool by_consumer) {
  // Under the lock, only find the byte ranges of whole small packets, and
  // take the blocks of large ones: the device no longer touches them, so
  // the small ones are copied after unlocking, and the blocks are lent.
  // Allocated before anything changes: nothing below throws.
  Taken taken;
  taken.pieces.reserve(chunks_.size());
  taken.retired.reserve(chunks_.size());
  FindWaiting(capacity, max_packets, needed, &taken);
  if (taken.packets > 0 && by_consumer) {
    consumer_ = std::this_thread::get_id();
    taken_ += taken.packets;
  }
  hurry_ = unread_ > 0;  // a backlog: the next batch at once
  lock.unlock();
  const Indexed indexed = CopyAndIndex(taken.pieces, dst, index);
  lock.lock();
  if (by_consumer) expect_request_ = indexed.requests;
  if (indexed.dropped > 0) {
    finished_ += indexed.dropped;
    bytes_ -= indexed.dropped_bytes;
    if (by_consumer) ForgetTaken(indexed.dropped);
    changed_.notify_all();
  }
  KeepForReuse(taken.retired);
  return indexed.count;
}

void DeviceQueue::FindWaiting(int64_t capacity, int64_t max_packets,
                              int64_t* needed, Taken* taken) {
  int64_t taken_bytes = 0;
  int64_t& packets = taken->packets;
  while (packets < max_packets && !chunks_.empty()) {
    Chunk* chunk = chunks_.front().get();
    if (chunk->block != nullptr) {  // a large packet, complete once queued
      taken->pieces.push_back({chunk->block->data, chunk->used, chunk->block});
      chunk->block = nullptr;
      unread_ -= chunk->used;
      ++packets;
      taken->retired.push_back(std::move(chunks_.front()));
      chunks_.pop_front();
      continue;
    }
    const int64_t begin = read_offset_;
    while (read_offset_ < chunk->used && packets < max_packets) {
      const int64_t size = ReadHeader(chunk->begin() + read_offset_).size;
      if (taken_bytes + size > capacity) {
        if (packets == 0) *needed = size;
        break;
      }
      read_offset_ += size;
      taken_bytes += size;
      ++packets;
    }
    if (read_offset_ > begin) {
      taken->pieces.push_back(
          {chunk->begin() + begin, read_offset_ - begin, nullptr});
      unread_ -= read_offset_ - begin;
    }
    // Stop in a chunk not read to its end, or where the device still writes.
    if (read_offset_ < chunk->used || chunks_.size() == 1) break;
    taken->retired.push_back(std::move(chunks_.front()));
    chunks_.pop_front();
    read_offset_ = 0;
  }
}

DeviceQueue::Indexed DeviceQueue::CopyAndIndex(
    const std::vector<Piece>& pieces, uint8_t* dst, IndexEntry* index) {
  // Its device gave up waiting for a request: nobody to answer.
  Calls* calls = links_.calls;
  Indexed indexed;
  auto add = [&](const PacketHeader& header, const IndexEntry& entry) {
    indexed.requests |= header.request_id != 0;
    if (header.request_id == 0 || calls->Waiting(header.request_id)) {
      index[indexed.count++] = entry;
      return true;
    }
    ++indexed.dropped;
    indexed.dropped_bytes += header.size;
    return false;
  };
  int64_t offset = 0;
  for (const Piece& piece : pieces) {
    if (piece.block != nullptr) {
      const PacketHeader header = ReadHeader(piece.begin);
      const IndexEntry lent{0, header.site, header.request_id, header.size,
                            reinterpret_cast<int64_t>(piece.block),
                            reinterpret_cast<int64_t>(piece.block->data)};
      if (!add(header, lent)) ReturnBlock(piece.block);
      continue;
    }
    std::memcpy(dst + offset, piece.begin, piece.bytes);
    for (const int64_t end = offset + piece.bytes; offset < end;) {
      const PacketHeader header = ReadHeader(dst + offset);
      add(header, IndexEntry{offset, header.site, header.request_id,
                             header.size, 0, 0});
      offset += header.size;
    }
  }
  return indexed;
}

void DeviceQueue::KeepForReuse(std::vector<std::unique_ptr<Chunk>>& retired) {
  for (std::unique_ptr<Chunk>& chunk : retired) {
    if (spare_.size() < kSpareChunks && chunk->data != nullptr &&
        chunk->capacity == kChunkBytes) {
      chunk->used = 0;
      try {
        spare_.push_back(std::move(chunk));
      } catch (const std::bad_alloc&) {
        break;  // reuse is optional; `retired` frees the rest
      }
    }
  }
}

void DeviceQueue::Release(int64_t packets, int64_t released_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_ += packets;
  bytes_ -= released_bytes;
  ForgetTaken(packets);
  changed_.notify_all();  // also a claim's owner that resumes
}

Status DeviceQueue::Reserve(int64_t size) {
  std::unique_lock<std::mutex> lock;
  if (Status status = LockWithRoom(size, &lock); !status.ok()) return status;
  CountSent(size);
  ++reserved_;
  return Status();
}

bool DeviceQueue::AppendReserved(std::unique_ptr<Chunk>& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t size = chunk->used;
  --reserved_;
  try {
    chunks_.push_back(std::move(chunk));
  } catch (const std::bad_alloc&) {
    CountConsumedAtOnce(size);  // the caller keeps the chunk
    return false;
  }
  PublishBlock(size);
  return true;
}

void DeviceQueue::CancelReserved(int64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  --reserved_;
  CountConsumedAtOnce(size);
}

bool DeviceQueue::WaitFinished(int64_t target, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  ++finish_waiters_;  // packets pushed meanwhile hurry the consumer
  if (unread_ > 0) {
    hurry_ = true;
    WakeConsumer();
  }
  const bool reached = changed_.wait_for(lock, Seconds(timeout_s),
                                         [&] { return finished_ >= target; });
  --finish_waiters_;
  return reached;
}

DeviceQueue::Stats DeviceQueue::ReadStats() {
  std::lock_guard<std::mutex> lock(mu_);
  return Stats{bytes_, enqueued_ - finished_, high_water_, enqueued_};
}

void DeviceQueue::RestartHighWater() {
  std::lock_guard<std::mutex> lock(mu_);
  high_water_ = bytes_;
}

bool DeviceQueue::HasUntaken() {
  std::lock_guard<std::mutex> lock(mu_);
  return unread_ > 0 || reserved_ > 0;
}

void DeviceQueue::WakeWaiters() {
  std::lock_guard<std::mutex> lock(mu_);
  changed_.notify_all();
}

void DeviceQueue::WakeConsumerToStop() {
  std::lock_guard<std::mutex> lock(mu_);
  not_empty_.notify_all();
}

bool DeviceQueue::Drained() const {
  // Both only grow, and finished never passes enqueued: equal counts read
  // in this order were equal when `finished` was read.
  const int64_t finished = finished_.Read();
  return enqueued_.Read() == finished;
}

}  // namespace hcb
