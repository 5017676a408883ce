// The CUDA transport's copies between a GPU and pinned host blocks, and the
// landing of each: a tap's operands are copied (asynchronously, on the
// computation's stream) into a pinned block, an event is recorded after the
// copy, and the packet reaches its device's queue only once the event
// completed; a `call` waits for its own copy-in's event (not the whole
// stream) and its results go back by a copy whose event frees their block.
// Nothing here waits for Python on the stream, and no lock is held while
// the stream or Python runs.
//
// Parts: PinnedAllocator (the BlockAllocator of pinned memory, through the
// CudaApi table of cuda_api.h), one BlockPool of pinned blocks, and per
// GPU a Landing: the copies in flight in stream order and the landing
// thread that waits for their events in that order. A block goes back to
// the pool only after the event of the last copy that touches it completed
// (a tap's block: once its packet was consumed, which follows its landing).
//
// Threads: device threads (XLA's, in the CUDA handlers, ffi_cuda.cc, or the
// tests' entry points, module_testing.cc) call Send, CopyIn, CopyOut; each Landing
// has one thread of its own, started on first use and never joined (it
// sleeps on a condition variable while nothing is in flight, and may be
// cut off at interpreter exit with events pending). Locks: `mu_` guards
// `landings_`; a Landing's `mu` guards its fields; a queue's own lock is
// taken (by its methods) only with neither held.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_CUDA_COPIES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_CUDA_COPIES_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "block_pool.h"
#include "cuda_api.h"
#include "device_queue.h"
#include "packet.h"
#include "status.h"

namespace hcb {

// The queue number of CUDA device `ordinal`: host_callback/devices.py's
// device_number of a GPU (past the CPU's numbers).
constexpr int64_t kCudaQueueBase = int64_t{1} << 20;
inline int64_t CudaQueueId(int64_t ordinal) { return kCudaQueueBase + ordinal; }

// A `call` holds two pinned blocks at once: its arguments' and its results'.
constexpr int64_t kBlocksPerCall = 2;

// A CUDA call that failed to give a pinned block (a bad_alloc for the pool,
// with the failing call's message).
class PinnedAllocFailure : public std::bad_alloc {
 public:
  explicit PinnedAllocFailure(std::string message)
      : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Pinned host memory (cudaHostAlloc, portable to every context).
class PinnedAllocator final : public BlockAllocator {
 public:
  uint8_t* Map(int64_t capacity) override;
  void Unmap(uint8_t* data, int64_t capacity) noexcept override;
};

// Copies in flight on one GPU, and the thread that lands them.
struct Landing;

class CudaCopies {
 public:
  CudaCopies();
  ~CudaCopies();  // never runs: the hub lives as long as the process

  // A tap from the GPU `ordinal`: reserves the packet's room in `queue`
  // (waiting, as on CPU, while the queue is over its bound: copies in flight
  // count), then enqueues on `stream` the copies of `arrays` (device memory)
  // into a pinned block and the event that lands the packet. A failure of a
  // CUDA call returns an error naming it, with nothing of this tap left to
  // complete on the stream that could touch a reused block.
  Status Send(int64_t ordinal, DeviceQueue* queue, cuda::Stream stream,
              int64_t site, const Span* arrays, size_t num_arrays);
  // A call's arguments: copies `arrays` into a pinned block and waits until
  // that copy's event completed (and every earlier packet of the GPU is in
  // its queue). On success `*block` holds them at `host` (the spans into
  // it); the caller gives it back (ReturnBlock).
  Status CopyIn(int64_t ordinal, cuda::Stream stream, const Span* arrays,
                size_t num_arrays, Block** block, Span* host);
  // A call's results: a pinned block for `outputs`' bytes (`host` its spans,
  // for the host function's answer); then CopyOut.
  Status ResultBlock(const Span* outputs, size_t num_outputs, Block** block,
                     Span* host);
  // Enqueues the copies of the answer (`host`, in `block`) to `outputs`
  // (device memory) and the event after which the block is freed; takes
  // the block in all cases.
  Status CopyOut(int64_t ordinal, cuda::Stream stream, Block* block,
                 const Span* host, const Span* outputs, size_t num_outputs);

  // A receiver attached with this queue bound. The pool keeps twice that
  // much: a `call` holds a block of its arguments and one of its results
  // at once, and pinned memory mapped again for each large call cost a
  // 256 MiB call's round trip 250 ms instead of tens (an H200).
  void SetQueueBound(int64_t bytes) {
    pool_.SetQueueBound(kBlocksPerCall * bytes);
  }
  BlockPool& pool() { return pool_; }
  // Copies ever issued and landed on `ordinal`, events made, and the
  // failure that stopped its transport ("" if none).
  void Stats(int64_t ordinal, int64_t* out, std::string* failure);

 private:
  Landing& LandingOf(int64_t ordinal);

  PinnedAllocator allocator_;
  BlockPool pool_;
  std::mutex mu_;
  std::unordered_map<int64_t, std::unique_ptr<Landing>> landings_;
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_CUDA_COPIES_H_
