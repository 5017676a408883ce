// The native core of host_callback's receiver: per-device packet queues
// bounded in bytes, and the reply slots of pending `call`s.
//
// Device threads (the FFI handlers in ffi_handlers.cc) push packets and wait
// for replies; the Python receiver threads (through the C API in c_api.cc)
// take batches, release consumed bytes and post replies. The queues live for
// the whole process; a receiver attaches to and detaches from them. A device
// that sends while no receiver is attached calls the restart hook (the only
// call into Python), which attaches a new one. Every wait re-checks at least
// every kPollInterval. A wait on Python's main thread also checks for Ctrl-C
// (the interrupt hook). No method lets a C++ exception escape with state
// half-changed: callers (c_api.cc, ffi_handlers.cc) turn them into errors.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hcb {

// Every packet starts with this header; array data follows, each array
// starting at a multiple of kAlign from the packet start.
struct PacketHeader {
  int64_t size;        // bytes of the whole packet, a multiple of kAlign
  int64_t site;        // which callback site (Python knows its layout)
  int64_t request_id;  // 0 for a tap, the reply slot's id for a call
  int64_t unused[5];
};
constexpr int64_t kAlign = 16;
constexpr int64_t kHeaderBytes = sizeof(PacketHeader);
static_assert(kHeaderBytes % kAlign == 0, "header must keep data aligned");

// One entry per packet written by Hub::Take for the Python decoder.
struct IndexEntry {
  int64_t offset;      // of the packet in the destination buffer
  int64_t site;
  int64_t request_id;
  int64_t size;
  // A large packet is not copied into the destination: `block` is its Block
  // (lent to the consumer, see Hub::ReturnBlock) and `address` its first
  // byte. Both 0 for a packet in the destination buffer.
  int64_t block;
  int64_t address;
};

constexpr auto kPollInterval = std::chrono::milliseconds(50);

inline int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A byte span to copy from (a device buffer) or into (a device result).
struct Span {
  void* data;
  int64_t bytes;
};

// Why an operation failed: canonical (absl) status codes, as XLA's FFI
// numbers them (ffi_handlers.cc checks that they agree).
enum class Code : uint8_t {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kNotFound = 5,
  kFailedPrecondition = 9,
  kResourceExhausted = 8,
  kInternal = 13,
  kUnavailable = 14,
};

// The outcome of a device-side operation.
struct Status {
  Code code = Code::kOk;
  std::string message;

  bool ok() const { return code == Code::kOk; }
};

// Packets of at least this many bytes are large: each is written into a
// Block of its own, which the host function's arrays then view, instead of
// being copied a second time into the receiver's batch buffer. Smaller ones
// are written back to back into chunks and copied in batches.
constexpr int64_t kLargePacket = 256 << 10;

// The memory of one large packet: pages mapped for it (transparent huge
// pages where the kernel allows), reused through the Hub's pool. A block
// belongs to one packet at a time: the queue's while it waits, then the
// consumer's (a host function's arrays view it) until Hub::ReturnBlock.
struct Block {
  uint8_t* data;
  int64_t capacity;
};

// A block where one device writes packets back to back; or, for one large
// packet, a wrapper of its Block.
struct Chunk {
  explicit Chunk(int64_t capacity)
      : data(new uint8_t[capacity]), capacity(capacity) {}
  explicit Chunk(Block* block)
      : block(block), capacity(block->capacity) {}
  ~Chunk();
  uint8_t* begin() const { return block != nullptr ? block->data : data.get(); }
  std::unique_ptr<uint8_t[]> data;
  Block* block = nullptr;  // owned: a large packet's, until Take lends it
  int64_t capacity;
  int64_t used = 0;  // bytes of complete packets; guarded by the queue's `mu`
};

// The packet queue of one device. `mu` guards every non-atomic field.
struct DeviceQueue {
  std::mutex mu;
  std::condition_variable not_empty;  // the consumer waits on it
  std::condition_variable changed;    // senders and finish-waiters wait on it
  // Front: the chunk being read from `read_offset`; back: being written.
  std::deque<std::unique_ptr<Chunk>> chunks;
  int64_t read_offset = 0;
  int64_t unread = 0;                 // bytes pushed, not yet taken
  std::vector<std::unique_ptr<Chunk>> spare;  // read chunks kept for reuse
  // The consumer sleeps in Take because the queue is empty (`idle`: the next
  // packet wakes it), or because it paces itself (`pacing`: only a hurry
  // wakes it). Taps are taken in batches, at most one per kBatchInterval:
  // each batch costs a Python consumer a GIL hand-off with the thread that
  // dispatches, which costs a jitted step more than its tap.
  bool consumer_idle = false;
  bool consumer_pacing = false;
  std::chrono::steady_clock::time_point last_take;
  // Take the next batch now: a request, a large packet, kHurryBytes or a
  // finish-waiter waits, or the last batch left a backlog (Take sets it to
  // whether unread bytes remain).
  bool hurry = false;
  int finish_waiters = 0;             // threads in Hub::WaitFinished
  bool expect_request = false;        // the last batch held one: spin first
  // Host functions run on a device thread (Hub::Call's direct path), nested
  // `direct_depth` deep in `direct_owner`: the consumer takes nothing while
  // `direct_busy`, unless the owner waits for the consumer (nested request).
  bool direct_busy = false;
  int direct_depth = 0;
  std::thread::id direct_owner;
  // The consumer thread while it consumes a taken batch (until its next Take).
  std::thread::id consumer;
  int64_t bytes = 0;                  // pushed and not yet released
  int64_t high_water = 0;
  int64_t enqueued = 0;               // packets ever pushed
  int64_t finished = 0;               // packets released (consumed)
  // Mirrors `enqueued` for a consumer that polls without `mu`; on its own
  // cache line, so that polling does not slow the device's writes.
  alignas(64) std::atomic<int64_t> pushed{0};
};

// The reply slot of one pending `call`; lives on the waiting device thread.
struct ReplySlot {
  const Span* outputs = nullptr;      // where the result bytes go
  size_t num_outputs = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> state{0};          // kPending, kDone or kFailed
  std::string error;                  // written before state turns kFailed
};
constexpr int kPending = 0, kDone = 1, kFailed = 2;

// What became of a reply (the values are hcb_reply's return codes).
enum class ReplyOutcome : int { kDelivered = 0, kNoWaiter = 1, kSizeMismatch = 2 };

// Called by a device that needs a receiver while none is attached; returns 0
// once one is attached.
using RestartHook = int (*)();

// Called by a device that waits on Python's main thread (every
// kPollInterval): returns nonzero when Ctrl-C (SIGINT) is pending, clearing
// it, so that the wait gives up.
using InterruptHook = int (*)();
// Re-arms Ctrl-C (Python's PyErr_SetInterrupt, callable without the GIL) on
// the main thread once a wait there gave up for it, or a host function run
// there was interrupted, so that Python raises KeyboardInterrupt again as
// soon as the failed computation returns to it. Never called for another
// thread: an interrupt fails only the computation whose host function it
// stopped, and reaches only the thread that waits on it.
using Rearm = void (*)();

// What a direct runner is asked to do: run the host function of `site` on
// the arrays `args` (device buffers, valid during the call) and write its
// results into `outputs` (the device's result buffers).
struct DirectRequest {
  int64_t device_id;
  int64_t site;
  const Span* args;
  size_t num_args;
  const Span* outputs;
  size_t num_outputs;
};

// What became of a direct run.
enum class DirectOutcome : int {
  kDone = 0,
  kFailed = 1,       // the host function (or its result) failed: `error`
  kDeclined = 2,     // not run: the request goes through the queue instead
  kInterrupted = 3,  // Ctrl-C (KeyboardInterrupt) stopped it: `error`
};

// Called by a device's consumer thread that makes a request of its own
// device (a host function running JAX code in the outfeed mode): consumes,
// in the device's order, what the consumer has taken and not yet consumed,
// else the next batch. Returns 0, or nonzero when no receiver can consume.
using NestedConsumer = int (*)(int64_t device_id);

// Runs a request's host function on the device thread (the extension
// module's runner, which takes the GIL). It declines only before the host
// function ran.
using DirectRunner = DirectOutcome (*)(const DirectRequest& request,
                                       std::string* error);

// The process-wide state. `mu_` guards `queues_`, `slots_` and
// `next_request_`; `sites_mu_` guards `sites_`. A reply slot leaves `slots_`
// when its device gives up or when a replier claims it; a claimed slot is
// finished (outside `mu_`) before its device may return.
class Hub {
 public:
  static Hub& Get();

  // A receiver starts (again) with this queue bound; the queues' high-water
  // marks restart.
  void Attach(int64_t max_bytes);
  // The receiver stopped. Returns whether packets are left for the next one
  // (sent after the last drain); a device that sends from now on calls the
  // restart hook.
  bool Detach();
  // Without a hook (at interpreter exit), a device that needs a receiver
  // fails instead, and so do the devices waiting now.
  void SetRestartHook(RestartHook hook);
  // Wakes every consumer waiting in Take, so that it re-checks its stop flag.
  void WakeConsumers();
  // With a runner, a request whose device has nothing queued runs its host
  // function on the device thread instead of a round trip to the receiver.
  void SetDirectRunner(DirectRunner runner);
  // With a nested consumer, a request made on a device's consumer thread is
  // queued and served by that thread (NestedConsumer); without, it fails.
  void SetNestedConsumer(NestedConsumer consumer);
  // Waits on the thread `main_thread` (pthread_self() of Python's main
  // thread) call `hook`, then `rearm` when it reports Ctrl-C; none without a
  // hook. A direct run interrupted on that thread calls `rearm` too.
  void SetInterruptHook(InterruptHook hook, Rearm rearm, uint64_t main_thread);

  // Records the byte size of each array that the packets of `site` carry;
  // a device that sends other sizes fails instead of sending.
  void RegisterSite(int64_t site, std::vector<int64_t> array_bytes);
  // Forgets a site; a device that sends to it from now on fails. Returns
  // whether it was registered.
  bool UnregisterSite(int64_t site);

  // The queue of a device, created on first use; never freed.
  DeviceQueue* Queue(int64_t device_id);

  // Device side: checks `arrays` against the site, then copies them into a
  // new packet on the device's queue, first waiting while the queue is over
  // its bound. This is the packet's only copy when it is large (a block from
  // the pool, which the host function's arrays then view).
  Status Send(int64_t device_id, int64_t site, int64_t request_id,
              const Span* arrays, size_t num_arrays);
  // Device side: sends a call packet (or runs it directly), then waits for
  // its reply, written into `outputs`.
  Status Call(int64_t device_id, int64_t site, const Span* arrays,
              size_t num_arrays, const Span* outputs, size_t num_outputs);

  // Consumer side: describes the next waiting packets, in order, in `index`
  // (at most `max_packets`), waiting up to `timeout_s` for the first. Small
  // packets are copied back to back into `dst` (`capacity` bytes); large
  // ones are not copied: their blocks are lent to the consumer, which gives
  // each back with ReturnBlock. Returns the number of entries; calls whose
  // device gave up are left out. Returns 0 with `*needed` set when the next
  // small packet is larger than `capacity`.
  int64_t Take(int64_t device_id, double timeout_s, uint8_t* dst,
               int64_t capacity, IndexEntry* index, int64_t max_packets,
               int64_t* needed);
  // Marks consumed packets finished and frees their bytes in the bound.
  void Release(int64_t device_id, int64_t packets, int64_t bytes);
  // Waits up to `timeout_s` until `target` packets are finished.
  bool WaitFinished(int64_t device_id, int64_t target, double timeout_s);

  // A block of at least `bytes`: a free one from the pool (which the
  // device has touched before, so no page faults) or a new one. Throws
  // std::bad_alloc when the system has no memory for it.
  Block* AcquireBlock(int64_t bytes);
  // Gives a block back once nothing views it: kept in the pool for reuse
  // while the pool holds at most the queue bound plus kPoolSlack bytes,
  // else unmapped (the oldest free blocks first).
  void ReturnBlock(Block* block) noexcept;
  // Writes the pool's free bytes, free blocks, blocks out of the pool (in
  // queues or lent) and bytes mapped in all.
  void PoolStats(int64_t* out);

  // Posts the result (or error) of request `request_id`; false if no
  // device waits for it any more. The result bytes are copied outside `mu_`.
  // When their sizes do not match the device's outputs, the device fails
  // with a message that says so.
  ReplyOutcome Reply(int64_t request_id, const Span* results,
                     size_t num_results);
  bool ReplyError(int64_t request_id, std::string message);

 private:
  class PendingRequest;

  Hub() = default;
  Status CheckSite(int64_t site, const Span* arrays, size_t num_arrays);
  // Send after CheckSite.
  Status Push(int64_t device_id, int64_t site, int64_t request_id,
              const Span* arrays, size_t num_arrays);
  // Runs a request's host function on the device thread when the queue is
  // idle; false when it did not (the request then goes through the queue).
  bool RunDirect(DirectRunner runner, DeviceQueue* queue,
                 const DirectRequest& request, Status* status);
  // Whether a signal handler raised on the main thread (see InterruptHook).
  bool Interrupted();
  bool OnMainThread();
  // Calls the Rearm hook when the calling thread is Python's main thread.
  void RearmOnMainThread();
  // Takes the slot of `request_id` out of `slots_` for its replier.
  ReplySlot* Claim(int64_t request_id);
  Chunk* ChunkWithRoom(DeviceQueue* queue, int64_t size);
  // Push for a large packet: reserves its room in the bound, copies it into
  // a block with `queue->mu` unlocked, then queues it.
  Status PushLarge(int64_t device_id, DeviceQueue* queue, std::unique_lock<std::mutex>& lock,
                   int64_t size, int64_t site, int64_t request_id,
                   const Span* arrays, size_t num_arrays);
  void Finish(ReplySlot* slot, int state);
  // Empty when a receiver is attached, after calling the hook if needed.
  Status EnsureReceiver(int64_t device_id);
  // Claims the device for a direct run when nothing is queued or being
  // consumed; false otherwise.
  bool BeginDirect(DeviceQueue* queue);
  void EndDirect(DeviceQueue* queue);
  // While a direct run's own thread waits for the consumer (a host function
  // that runs JAX code with a request on its device), the consumer may take.
  // Returns whether it changed anything, for ResumeDirect.
  bool SuspendDirect(DeviceQueue* queue);
  void ResumeDirect(DeviceQueue* queue);
  // Whether the calling thread is the device's consumer, inside a batch.
  bool IsConsumer(DeviceQueue* queue);

  std::atomic<bool> attached_{false};
  std::atomic<RestartHook> restart_hook_{nullptr};
  std::atomic<DirectRunner> direct_runner_{nullptr};
  std::atomic<NestedConsumer> nested_consumer_{nullptr};
  std::atomic<InterruptHook> interrupt_hook_{nullptr};
  std::atomic<Rearm> rearm_{nullptr};
  std::atomic<uint64_t> main_thread_{0};
  std::atomic<int64_t> wake_generation_{0};
  std::atomic<int64_t> max_bytes_{256'000'000};
  std::mutex mu_;
  std::unordered_map<int64_t, std::unique_ptr<DeviceQueue>> queues_;
  // Lock-free lookup for small device ids; entries are set once under `mu_`.
  static constexpr int64_t kFastDeviceIds = 1024;
  std::atomic<DeviceQueue*> fast_[kFastDeviceIds] = {};
  std::unordered_map<int64_t, ReplySlot*> slots_;
  int64_t next_request_ = 1;
  std::shared_mutex sites_mu_;
  std::unordered_map<int64_t, std::vector<int64_t>> sites_;
  // The pool of free blocks, oldest first, and its counts; all guarded by
  // `pool_mu_`, under which no other lock is taken.
  std::mutex pool_mu_;
  std::deque<Block*> free_blocks_;
  int64_t free_bytes_ = 0;
  int64_t blocks_out_ = 0;
  int64_t mapped_bytes_ = 0;
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_HUB_H_
