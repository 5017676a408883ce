// The packet queue of one device: its packets, in the chunks they are
// written into, bounded in bytes; the consumer's batches (Take) and what it
// finished (Release); and waiting until packets are finished (for barriers).
//
// Threads: the device's threads push (the FFI handlers, through Hub::Send
// and Hub::Call); one consumer thread at a time takes and releases (the
// Python receiver, through the extension module); any thread may wait for
// finished packets. Its lock, `mu_`, is its own: it guards every
// non-atomic field, including the claim of a direct run (direct_runs.h) or
// a guest, which Take respects (the protocol: "The queue protocol" in
// docs/architecture.md); others reach the state only through the methods below. A
// large packet's block is acquired from the queue's BlockPool, and the
// reply table of Calls is asked, with `mu_` unlocked.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_DEVICE_QUEUE_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_DEVICE_QUEUE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "block_pool.h"
#include "calls.h"
#include "interrupts.h"
#include "packet.h"
#include "receiver_link.h"
#include "status.h"

namespace hcb {

// A count that only the holder of its queue's lock changes, and that may
// also be read without the lock (DeviceQueue::Drained): no atomic
// read-modify-write on the device's path.
class LockedCount {
 public:
  LockedCount& operator+=(int64_t n) {
    value_.store(value_.load(std::memory_order_relaxed) + n,
                 std::memory_order_release);
    return *this;
  }
  LockedCount& operator++() { return *this += 1; }
  // Under the lock.
  operator int64_t() const { return value_.load(std::memory_order_relaxed); }
  // Without the lock.
  int64_t Read() const { return value_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> value_{0};
};

// A buffer where one device writes packets back to back; or, for one large
// packet, a wrapper of its Block.
struct Chunk {
  explicit Chunk(int64_t capacity)
      : data(new uint8_t[capacity]), capacity(capacity) {}
  explicit Chunk(Block* block)
      : block(block), capacity(block->capacity) {}
  ~Chunk() {
    if (block != nullptr) ReturnBlock(block);
  }
  uint8_t* begin() const { return block != nullptr ? block->data : data.get(); }
  std::unique_ptr<uint8_t[]> data;
  Block* block = nullptr;  // owned: a large packet's, until Take lends it
  int64_t capacity;
  int64_t used = 0;  // bytes of complete packets; guarded by the queue's `mu_`
};

// A consumer woken for taps on an empty queue waits this long before it
// takes them (unless in a hurry): what a barrier needs to take them first.
// The Python transport waits as long (module.cc exports it).
constexpr auto kGuestGrace = std::chrono::microseconds(200);

// The parts a queue works with, set once when it is made (Hub::Queue).
struct QueueLinks {
  ReceiverLink* receiver;  // is one attached, the bound, the restart hook
  Interrupts* interrupts;  // Ctrl-C while a device waits for room
  BlockPool* pool;         // the blocks of large packets
  Calls* calls;            // whether a request's device still waits
};

class DeviceQueue {
 public:
  DeviceQueue(int64_t device_id, const QueueLinks& links)
      : device_id_(device_id), links_(links) {}

  int64_t device_id() const { return device_id_; }

  // Device side: copies `arrays` into a new packet, first waiting while the
  // queue is over its bound. This is the packet's only copy when it is
  // large (a block from the pool, which the host function's arrays then
  // view). The arrays were checked against the site (SiteSizes::Check).
  Status Push(int64_t site, int64_t request_id, const Span* arrays,
              size_t num_arrays);

  // Device side, for a packet whose bytes land later (a GPU's copy into a
  // pinned block, cuda_copies.h): waits for room as Push does, then counts
  // `size` bytes and one packet as sent (in the bound, for barriers) before
  // they exist. Exactly one of AppendReserved (in the order of the
  // reservations: the packets' order) and CancelReserved follows.
  Status Reserve(int64_t size);
  // The reserved packet landed in `chunk` (a block, `used` its size): queued
  // for the consumer. False (the chunk left with the caller, the packet
  // counted as consumed) when the queue has no memory for it.
  bool AppendReserved(std::unique_ptr<Chunk>& chunk);
  // The reserved packet will not come: counted as consumed at once.
  void CancelReserved(int64_t size);

  // Consumer side: describes the next waiting packets, in order, in `index`
  // (at most `max_packets`), waiting up to `timeout_s` for the first. Small
  // packets are copied back to back into `dst` (`capacity` bytes); large
  // ones are not copied: their blocks are lent to the consumer, which gives
  // each back to its pool. Returns the number of entries; requests whose
  // device gave up are left out. Returns 0 with `*needed` set when the next
  // small packet is larger than `capacity`.
  int64_t Take(double timeout_s, uint8_t* dst, int64_t capacity,
               IndexEntry* index, int64_t max_packets, int64_t* needed);
  // Marks consumed packets finished and frees their bytes in the bound.
  void Release(int64_t packets, int64_t bytes);
  // Waits up to `timeout_s` until `target` packets are finished.
  bool WaitFinished(int64_t target, double timeout_s);

  // What the module reports of the queue (native_library.stats).
  struct Stats {
    int64_t bytes;       // pushed and not yet released
    int64_t waiting;     // packets pushed and not finished
    int64_t high_water;  // the most `bytes` since the receiver attached
    int64_t enqueued;    // packets ever pushed
  };
  Stats ReadStats();
  // A receiver attached: the high-water mark restarts from now.
  void RestartHighWater();
  // Whether packets wait that no consumer has taken, or are reserved and
  // not landed (Hub::Detach: left for the next receiver).
  bool HasUntaken();
  // Wakes the devices that wait for room and the threads in WaitFinished,
  // so that they re-check the receiver (stopped, or no restart hook).
  void WakeWaiters();
  // Wakes the consumer waiting in Take, so that it re-checks its stop flag.
  void WakeConsumerToStop();
  // Whether every packet pushed so far is finished; without the lock.
  bool Drained() const;

  // Claims (device_queue_claims.cc): the protocol, its states and its
  // names, shared with the Python queue, are written down in "The queue
  // protocol" of docs/architecture.md. The consumer takes nothing while
  // the queue is claimed, unless the claim is suspended.
  //
  // A direct run (direct_runs.h): the calling thread claims the queue for
  // a host function run on it when nothing is queued or being consumed, or
  // deepens its own claim; false when it may not.
  bool ClaimIfIdle();
  // ClaimIfIdle for a direct run that must follow what its device sent
  // before it (a GPU's buffers=True call behind taps in flight): waits
  // for the queue to become idle (hurrying the consumer), and claims it
  // then. Ctrl-C, or no receiver to consume what waits, ends the wait with
  // the error, as WaitForRoom's.
  Status ClaimWhenIdle();
  // Ends one level of the calling thread's claim; the last one releases
  // the queue, and the consumer takes again. Does nothing on a thread that
  // holds no claim.
  void EndClaim();
  // While the claim's owner waits for the consumer (a request of its own
  // device), the consumer may take: returns whether a claim was suspended,
  // to ResumeClaim.
  bool SuspendClaim();
  // The claim is active again (the consumer takes nothing new), once the
  // consumer has released what it took meanwhile: until then it may take
  // again, nested, and the owner waits, so that the device's host
  // functions still run one at a time. A thread never waits for a batch
  // it holds itself; Ctrl-C on Python's main thread ends the wait (the
  // claim active, the interrupt re-armed).
  void ResumeClaim();
  // A guest, a thread that waits for the queue to drain (barrier_wait),
  // takes the next waiting packet to consume it itself, as Take describes
  // it, when no consumer holds a batch and no host function runs on a
  // device thread. The guest then claims the queue as a direct run does
  // (direct_runs.h): the consumer takes nothing until EndGuest. Returns 0,
  // claiming nothing, when it may not or nothing waits, and with `*needed`
  // set when the packet is larger than `capacity`.
  // With `tap` set, only when the next waiting packet is a tap (no request)
  // of that site and byte size, written in the queue's chunks (not a large
  // packet's block); else 0, claiming nothing.
  struct Tap {
    int64_t site;
    int64_t bytes;
  };
  int64_t TakeAsGuest(uint8_t* dst, int64_t capacity, IndexEntry* index,
                      int64_t* needed, const Tap* tap = nullptr);
  // The site of the next waiting packet when it is a tap written in the
  // queue's chunks; false otherwise (nothing waits, a request, a large
  // packet). What TakeAsGuest with `tap` takes, unless another thread
  // takes first.
  bool NextTapSite(int64_t* site);
  // On the guest's thread: what it took is finished (consumed, or given up
  // by an interrupted guest), and the claim ends. Does nothing elsewhere,
  // or when the thread holds no guest's claim.
  void EndGuest();
  // Whether the calling thread is the queue's consumer, holding packets it
  // took and has not released: a request it makes is served by it (the
  // nested consumer).
  bool ConsumingOnThisThread();

 private:
  Chunk* ChunkWithRoom(int64_t size);
  // Under `mu_` (held by `lock`, released while it copies): describes up to
  // `max_packets` waiting packets, as Take does; the consumer's batch when
  // `by_consumer`, else a guest's.
  int64_t TakeWaiting(std::unique_lock<std::mutex>& lock, uint8_t* dst,
                      int64_t capacity, IndexEntry* index,
                      int64_t max_packets, int64_t* needed, bool by_consumer);
  // TakeWaiting's phases. A byte range of whole small packets in a chunk,
  // or a large packet's block.
  struct Piece {
    const uint8_t* begin;
    int64_t bytes;
    Block* block;  // a large packet's, else null
  };
  struct Taken {
    std::vector<Piece> pieces;
    std::vector<std::unique_ptr<Chunk>> retired;  // read to their end
    int64_t packets = 0;
  };
  struct Indexed {
    int64_t count = 0;  // entries written to the index
    int64_t dropped = 0, dropped_bytes = 0;  // requests nobody waits for
    bool requests = false;                   // any request among them
  };
  // Under `mu_`: finds up to `max_packets` waiting packets within
  // `capacity` bytes (`*needed`: the first one's size where it alone does
  // not fit), and takes them off the queue.
  void FindWaiting(int64_t capacity, int64_t max_packets, int64_t* needed,
                   Taken* taken);
  // Without `mu_`: copies the small packets into `dst`, and indexes those
  // and the lent blocks; drops requests whose device gave up waiting.
  Indexed CopyAndIndex(const std::vector<Piece>& pieces, uint8_t* dst,
                       IndexEntry* index);
  // Under `mu_`: keeps read chunks as spares, up to kSpareChunks.
  void KeepForReuse(std::vector<std::unique_ptr<Chunk>>& retired);
  // Under `mu_` (held by `lock`, released while it waits): waits while the
  // queue is over its bound.
  Status WaitForRoom(std::unique_lock<std::mutex>& lock, int64_t size);
  // Push and Reserve: makes sure a receiver is attached, then takes `mu_` in
  // `*lock` once the queue has room for `size` more bytes.
  Status LockWithRoom(int64_t size, std::unique_lock<std::mutex>* lock);
  // Under `mu_`: counts a packet of `size` bytes as sent, in the bound and
  // for barriers and direct runs.
  void CountSent(int64_t size);
  // Under `mu_`: a packet counted as sent that will never be queued counts as
  // consumed at once.
  void CountConsumedAtOnce(int64_t size);
  // Under `mu_`: the packet just queued in a block of its own (lent to the
  // consumer, not copied) is ready to be taken.
  void PublishBlock(int64_t size);
  // Push for a large packet: reserves its room in the bound, copies it into
  // a block with `mu_` unlocked, then queues it.
  Status PushLarge(std::unique_lock<std::mutex>& lock, int64_t size,
                   int64_t site, int64_t request_id, const Span* arrays,
                   size_t num_arrays);

  // Under `mu_`: whether the calling thread is the consumer, holding
  // packets it took and has not released.
  bool ConsumingHere() const {
    return taken_ > 0 && consumer_ == std::this_thread::get_id();
  }
  // Under `mu_`: `packets` the consumer took are finished (released, or
  // dropped: nobody waits for them); once none is left it is no consumer.
  void ForgetTaken(int64_t packets) {
    taken_ = taken_ > packets ? taken_ - packets : 0;
    if (taken_ == 0) consumer_ = std::thread::id();
  }
  // Under `mu_`: whether the calling thread holds the claim.
  bool HoldsClaim() const {
    return claim_depth_ > 0 && claim_owner_ == std::this_thread::get_id();
  }
  // Under `mu_`: the calling thread claims the device, or deepens its
  // claim (a direct run, or a guest).
  void Claim() {
    if (claim_depth_++ == 0) claim_owner_ = std::this_thread::get_id();
    claim_active_ = true;
  }
  // Under `mu_`: whether a direct run on the calling thread may claim the
  // queue (ClaimIfIdle).
  bool IdleForThisThread() const {
    if (claim_depth_ > 0 && claim_owner_ != std::this_thread::get_id()) {
      return false;
    }
    // Finished counts lag until the consumer's next Take: a consumer between
    // batches still counts as busy, so order with queued packets holds.
    return enqueued_ == finished_;
  }
  // Under `mu_`: the last claim ends; the consumer takes again, at once if
  // packets arrived meanwhile, and a thread in ClaimWhenIdle looks again.
  void ReleaseClaim() {
    claim_depth_ = 0;
    claim_owner_ = std::thread::id();
    claim_active_ = false;
    if (finish_waiters_ > 0) changed_.notify_all();
    if (unread_ > 0) {
      hurry_ = true;
      WakeConsumer();
    }
  }
  // Under `mu_`: wakes the consumer if it sleeps on an empty queue, or if
  // it paces itself and the queue is in a hurry.
  void WakeConsumer() {
    if (consumer_idle_ || (consumer_pacing_ && hurry_)) {
      not_empty_.notify_one();
    }
  }

  const int64_t device_id_;
  const QueueLinks links_;

  std::mutex mu_;
  std::condition_variable not_empty_;  // the consumer waits on it
  // Senders, finish-waiters and ClaimWhenIdle wait on it.
  std::condition_variable changed_;
  // Front: the chunk being read from `read_offset_`; back: being written.
  std::deque<std::unique_ptr<Chunk>> chunks_;
  // The header of the next packet waiting in a chunk, as NextTapSite and
  // TakeAsGuest read it; false when none waits, or a large packet's block
  // comes first. Under `mu_`.
  bool NextInChunk(PacketHeader* header) const;
  int64_t read_offset_ = 0;
  int64_t unread_ = 0;                 // bytes pushed, not yet taken
  std::vector<std::unique_ptr<Chunk>> spare_;  // read chunks kept for reuse
  // The consumer sleeps in Take because the queue is empty (`idle`: the next
  // packet wakes it), or because it paces itself (`pacing`: only a hurry
  // wakes it). Taps are taken in batches, at most one per kBatchInterval:
  // each batch costs a Python consumer a GIL hand-off with the thread that
  // dispatches, which costs a jitted step more than its tap.
  bool consumer_idle_ = false;
  bool consumer_pacing_ = false;
  std::chrono::steady_clock::time_point last_take_;
  // Take the next batch now: a request, a large packet, kHurryBytes or a
  // finish-waiter waits, or the last batch left a backlog (Take sets it to
  // whether unread bytes remain).
  bool hurry_ = false;
  int finish_waiters_ = 0;  // threads in WaitFinished or ClaimWhenIdle
  bool expect_request_ = false;        // the last batch held one: spin first
  // The claim, a direct run's (DirectRuns) or a guest's (TakeAsGuest),
  // nested `claim_depth_` deep in `claim_owner_`: the consumer takes
  // nothing while `claim_active_` (false while the owner suspends it, to
  // wait for the consumer: a nested request).
  bool claim_active_ = false;
  int claim_depth_ = 0;
  std::thread::id claim_owner_;
  // The claim is a guest's (TakeAsGuest), who took these and has not
  // finished them.
  bool guest_ = false;
  int64_t guest_packets_ = 0;
  int64_t guest_bytes_ = 0;
  // Packets the consumer took (Take) and has not released (Release), and
  // the thread that took them: the consumer until it released them all,
  // also across a nested Take.
  int64_t taken_ = 0;
  std::thread::id consumer_;
  int64_t bytes_ = 0;                  // pushed and not yet released
  int64_t reserved_ = 0;               // Reserve'd packets not yet landed
  int64_t high_water_ = 0;
  LockedCount enqueued_;               // packets ever pushed
  LockedCount finished_;               // packets released (consumed)
  // Mirrors `enqueued_` for a consumer that polls without `mu_`; on its own
  // cache line, so that polling does not slow the device's writes.
  alignas(64) std::atomic<int64_t> pushed_{0};
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_DEVICE_QUEUE_H_
