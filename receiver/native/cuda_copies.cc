// The CUDA transport's copies and their landing: see cuda_copies.h.

#include "cuda_copies.h"

#include <thread>
#include <utility>

#include "waits.h"

namespace hcb {
namespace {

// Pinned blocks are allocated in multiples of this (a tap's packet is often
// a few bytes; the CPU's pool uses 64 KiB).
constexpr int64_t kPinnedGrain = 4 << 10;
// The landing thread polls an event this long before it sleeps in
// cudaEventSynchronize (blocking-sync events: no core burnt meanwhile).
constexpr auto kEventSpin = std::chrono::microseconds(20);

Status NotLoaded() {
  return Failure(Code::kFailedPrecondition,
                 "host_callback: a CUDA callback ran before the CUDA runtime "
                 "was loaded");
}

// The byte spans of `count` arrays of `bytes(i)` each laid out from
// `offset` in `block` (aligned as in a packet).
template <typename Bytes>
void LayOut(Block* block, int64_t offset, size_t count, Bytes bytes,
            Span* host) {
  for (size_t i = 0; i < count; ++i) {
    host[i] = {block->data + offset, bytes(i)};
    offset += AlignUp(bytes(i));
  }
}

}  // namespace

uint8_t* PinnedAllocator::Map(int64_t capacity) {
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) throw PinnedAllocFailure(NotLoaded().message);
  void* data = nullptr;
  const cuda::Error error = api->cudaHostAlloc(
      &data, static_cast<size_t>(capacity), cuda::kHostAllocPortable);
  if (error != cuda::kSuccess || data == nullptr) {
    throw PinnedAllocFailure(CudaFailure(
        *api, "cudaHostAlloc", error,
        ("for " + std::to_string(capacity) + " bytes of pinned memory")
            .c_str()));
  }
  return static_cast<uint8_t*>(data);
}

void PinnedAllocator::Unmap(uint8_t* data, int64_t) noexcept {
  if (const CudaApi* api = GetCudaApi()) api->cudaFreeHost(data);
}

// What lands when `event` completed.
struct InFlight {
  cuda::Event event = nullptr;
  Block* block = nullptr;        // the copies' pinned block
  bool keep = false;             // its caller keeps `block` (CopyIn)
  DeviceQueue* queue = nullptr;  // a tap's: `block` is its packet there
  int64_t size = 0;              // the packet's bytes, reserved in `queue`
  bool deliver = false;          // queue the packet (else cancel it)
  int64_t seq = 0;               // its place in stream order
};

struct Landing {
  std::mutex mu;
  std::condition_variable work;     // the landing thread waits for entries
  std::condition_variable done;     // CopyIn waits for its entry
  std::deque<InFlight> pending;     // in stream order
  std::vector<cuda::Event> events;  // completed, for reuse
  int64_t issued = 0;               // seq of the last entry
  int64_t landed = 0;               // seq of the last landed entry
  int64_t events_made = 0;
  std::string failure;              // an event failed: no more copies
};

namespace {

// An entry that will not land as planned: its reservation is canceled, and
// its block goes back to the pool when nothing can write it any more
// (`reusable`), else is never reused.
void Drop(InFlight& entry, bool reusable) {
  if (entry.queue != nullptr) entry.queue->CancelReserved(entry.size);
  if (entry.block != nullptr && !entry.keep && reusable) {
    ReturnBlock(entry.block);
  }
}

// An entry whose event completed (`ok`) or failed.
void Finish(InFlight& entry, bool ok) {
  if (!ok) {  // the stream failed: the block is never reused
    Drop(entry, false);
    return;
  }
  if (!entry.deliver) {
    Drop(entry, true);
    return;
  }
  std::unique_ptr<Chunk> chunk(new (std::nothrow) Chunk(entry.block));
  if (chunk == nullptr) {
    Drop(entry, true);
    return;
  }
  chunk->used = entry.size;
  entry.queue->AppendReserved(chunk);  // on failure ~Chunk returns the block
}

// The landing thread of one GPU: waits for the events in stream order.
void Land(Landing* landing) {
  std::unique_lock<std::mutex> lock(landing->mu);
  while (true) {
    landing->work.wait(lock, [&] { return !landing->pending.empty(); });
    // Set: an entry exists only once a CUDA call made it (Issue).
    const CudaApi& api = *GetCudaApi();
    const cuda::Event event = landing->pending.front().event;
    lock.unlock();
    cuda::Error error = cuda::kNotReady;
    const char* call = "cudaEventQuery";
    Spin(kEventSpin, [&] {
      error = api.cudaEventQuery(event);
      return error != cuda::kNotReady;
    });
    if (error == cuda::kNotReady) {
      call = "cudaEventSynchronize";
      error = api.cudaEventSynchronize(event);
    }
    lock.lock();
    InFlight entry = landing->pending.front();
    landing->pending.pop_front();
    const bool ok = error == cuda::kSuccess;
    if (ok) {
      landing->events.push_back(event);  // reserved when it was made
    } else if (landing->failure.empty()) {
      landing->failure = CudaFailure(
          api, call, error,
          "while the host waited for a GPU callback's copy; this GPU's "
          "callbacks stop");
    }
    lock.unlock();
    Finish(entry, ok);
    lock.lock();
    landing->landed = entry.seq;
    landing->done.notify_all();
  }
}

Status Failed(Landing& landing) {
  std::lock_guard<std::mutex> lock(landing.mu);
  if (landing.failure.empty()) return Status();
  return Failure(Code::kInternal, landing.failure);
}

// Issue's first phase: an event to record after the copies, one that
// landed before (reusable) or a new one, for which room among the reusable
// ones is kept first. An error names the failing call; on bad_alloc the new
// event is destroyed. Either way no event is taken.
Status AcquireEvent(const CudaApi& api, Landing& landing, cuda::Event* event) {
  {
    std::lock_guard<std::mutex> lock(landing.mu);
    if (!landing.events.empty()) {
      *event = landing.events.back();
      landing.events.pop_back();
      return Status();
    }
  }
  const cuda::Error error = api.cudaEventCreateWithFlags(
      event, cuda::kEventBlockingSync | cuda::kEventDisableTiming);
  if (error != cuda::kSuccess) {
    return Failure(Code::kInternal,
                   CudaFailure(api, "cudaEventCreateWithFlags", error,
                               "for a GPU callback's copy"));
  }
  try {
    std::lock_guard<std::mutex> lock(landing.mu);
    landing.events.reserve(static_cast<size_t>(landing.events_made + 1));
    ++landing.events_made;
  } catch (const std::bad_alloc&) {
    api.cudaEventDestroy(*event);
    throw;
  }
  return Status();
}

// Issue's second phase: enqueues the copies of `src[i]` into `dst[i]`
// (`kind`) on `stream`, up to the first that fails. Returns that one's
// error (empty when none failed); `*enqueued`: whether any copy is on the
// stream.
std::string EnqueueCopies(const CudaApi& api, cuda::Stream stream, int kind,
                          const Span* dst, const Span* src, size_t count,
                          bool* enqueued) {
  *enqueued = false;
  for (size_t i = 0; i < count; ++i) {
    if (src[i].bytes == 0) continue;
    const cuda::Error error =
        api.cudaMemcpyAsync(dst[i].data, src[i].data,
                            static_cast<size_t>(src[i].bytes), kind, stream);
    if (error != cuda::kSuccess) {
      return CudaFailure(api, "cudaMemcpyAsync", error,
                         kind == cuda::kMemcpyDeviceToHost
                             ? "copying a GPU callback's operands to the host"
                             : "copying a GPU callback's results to the "
                               "device");
    }
    *enqueued = true;
  }
  return std::string();
}

// Records `event` after the copies on `stream`: empty, or the error.
std::string RecordEvent(const CudaApi& api, cuda::Event event,
                        cuda::Stream stream) {
  const cuda::Error error = api.cudaEventRecord(event, stream);
  if (error == cuda::kSuccess) return std::string();
  return CudaFailure(api, "cudaEventRecord", error,
                     "after a GPU callback's copy");
}

// Issue's last phase, with an event recorded after the copies: the landing
// thread takes `entry` when it completes; `*seq` is its place.
void HandToLanding(Landing& landing, InFlight entry, cuda::Event event,
                   int64_t* seq) {
  entry.event = event;
  std::lock_guard<std::mutex> lock(landing.mu);
  entry.seq = ++landing.issued;
  *seq = entry.seq;
  landing.pending.push_back(entry);
  landing.work.notify_one();
}

// Issue's last phase, with no event recorded: `event` is reusable, and
// `entry` is dropped; its block is free once the stream is, where a copy
// was `enqueued` (if that cannot be known, the block is never reused).
void DropUnrecorded(const CudaApi& api, Landing& landing, cuda::Stream stream,
                    cuda::Event event, InFlight& entry, bool enqueued) {
  {
    std::lock_guard<std::mutex> lock(landing.mu);
    landing.events.push_back(event);  // room was kept for it
  }
  Drop(entry, !enqueued || api.cudaStreamSynchronize(stream) == cuda::kSuccess);
}

// Enqueues on `stream` the copies of `src[i]` into `dst[i]` (`kind`), then
// an event, and hands `entry` to the landing thread with that event; `*seq`
// is its place. On a failing CUDA call it returns an error naming the call
// and nothing is left half-done: copies already enqueued are followed by an
// event whose landing drops the entry (or the stream is synchronized, and
// failing that too, the block is never reused). Takes `entry` in all cases.
Status Issue(const CudaApi& api, Landing& landing, cuda::Stream stream,
             int kind, const Span* dst, const Span* src, size_t count,
             InFlight entry, int64_t* seq) {
  cuda::Event event = nullptr;
  Status acquired;
  try {
    acquired = AcquireEvent(api, landing, &event);
  } catch (...) {
    Drop(entry, true);  // nothing was enqueued
    throw;
  }
  if (!acquired.ok()) {
    Drop(entry, true);
    return acquired;
  }
  bool enqueued = false;
  std::string failure =
      EnqueueCopies(api, stream, kind, dst, src, count, &enqueued);
  bool recorded = false;
  if (failure.empty()) {
    failure = RecordEvent(api, event, stream);
    recorded = failure.empty();
  } else if (enqueued) {
    // The copies enqueued before the failure still write the block: an
    // event after them lands the entry as dropped.
    recorded = RecordEvent(api, event, stream).empty();
  }
  if (!failure.empty()) {
    entry.deliver = false;
    entry.keep = false;  // the caller gets an error, not the block
  }
  if (recorded) {
    HandToLanding(landing, entry, event, seq);
  } else {
    DropUnrecorded(api, landing, stream, event, entry, enqueued);
  }
  if (failure.empty()) return Status();
  return Failure(Code::kInternal, failure);
}

}  // namespace

CudaCopies::CudaCopies()
    : pool_(&allocator_, kBlocksPerCall * kDefaultQueueBound, kPinnedGrain) {}

CudaCopies::~CudaCopies() = default;

Landing& CudaCopies::LandingOf(int64_t ordinal) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Landing>& landing = landings_[ordinal];
  if (landing == nullptr) {
    auto made = std::make_unique<Landing>();
    std::thread(Land, made.get()).detach();  // lives as long as the process
    landing = std::move(made);
  }
  return *landing;
}

Status CudaCopies::Send(int64_t ordinal, DeviceQueue* queue,
                        cuda::Stream stream, int64_t site, const Span* arrays,
                        size_t num_arrays) {
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) return NotLoaded();
  Landing& landing = LandingOf(ordinal);
  if (Status status = Failed(landing); !status.ok()) return status;
  const int64_t size = PacketSize(arrays, num_arrays);
  std::vector<Span> host(num_arrays);
  if (Status status = queue->Reserve(size); !status.ok()) return status;
  InFlight entry;
  entry.queue = queue;
  entry.size = size;
  entry.deliver = true;
  try {
    entry.block = pool_.Acquire(size);
  } catch (const std::bad_alloc& error) {
    queue->CancelReserved(size);
    return Failure(Code::kResourceExhausted, error.what());
  }
  WritePacket(entry.block->data, size, site, 0, nullptr, 0);  // the header
  LayOut(entry.block, kHeaderBytes, num_arrays,
         [&](size_t i) { return arrays[i].bytes; }, host.data());
  int64_t seq = 0;
  return Issue(*api, landing, stream, cuda::kMemcpyDeviceToHost, host.data(),
               arrays, num_arrays, entry, &seq);
}

Status CudaCopies::CopyIn(int64_t ordinal, cuda::Stream stream,
                          const Span* arrays, size_t num_arrays, Block** block,
                          Span* host) {
  *block = nullptr;
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) return NotLoaded();
  Landing& landing = LandingOf(ordinal);
  if (Status status = Failed(landing); !status.ok()) return status;
  InFlight entry;
  entry.keep = true;
  try {
    entry.block = pool_.Acquire(PacketSize(arrays, num_arrays));
  } catch (const std::bad_alloc& error) {
    return Failure(Code::kResourceExhausted, error.what());
  }
  LayOut(entry.block, 0, num_arrays, [&](size_t i) { return arrays[i].bytes; },
         host);
  Block* in = entry.block;
  int64_t seq = 0;
  if (Status status = Issue(*api, landing, stream, cuda::kMemcpyDeviceToHost,
                            host, arrays, num_arrays, entry, &seq);
      !status.ok()) {
    return status;
  }
  std::unique_lock<std::mutex> lock(landing.mu);
  while (landing.landed < seq) landing.done.wait_for(lock, kPollInterval);
  if (!landing.failure.empty()) {  // the block is never reused
    return Failure(Code::kInternal, landing.failure);
  }
  *block = in;
  return Status();
}

Status CudaCopies::ResultBlock(const Span* outputs, size_t num_outputs,
                               Block** block, Span* host) {
  try {
    *block = pool_.Acquire(PacketSize(outputs, num_outputs));
  } catch (const std::bad_alloc& error) {
    *block = nullptr;
    return Failure(Code::kResourceExhausted, error.what());
  }
  LayOut(*block, 0, num_outputs, [&](size_t i) { return outputs[i].bytes; },
         host);
  return Status();
}

Status CudaCopies::CopyOut(int64_t ordinal, cuda::Stream stream, Block* block,
                           const Span* host, const Span* outputs,
                           size_t num_outputs) {
  InFlight entry;
  entry.block = block;
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) {
    Drop(entry, true);
    return NotLoaded();
  }
  int64_t seq = 0;
  return Issue(*api, LandingOf(ordinal), stream, cuda::kMemcpyHostToDevice,
               outputs, host, num_outputs, entry, &seq);
}

void CudaCopies::Stats(int64_t ordinal, int64_t* out, std::string* failure) {
  Landing& landing = LandingOf(ordinal);
  std::lock_guard<std::mutex> lock(landing.mu);
  out[0] = landing.issued;
  out[1] = landing.landed;
  out[2] = static_cast<int64_t>(landing.pending.size());
  out[3] = landing.events_made;
  *failure = landing.failure;
}

}  // namespace hcb
