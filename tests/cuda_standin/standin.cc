// A stand-in for the CUDA runtime functions of host_callback's CudaApi table
// (receiver/native/cuda_api.h), for the tests only: built by
// tests/test_cuda_transport.py into a temporary directory and installed with
// the extension's `_testing_cuda_standin`, which refuses unless
// HOST_CALLBACK_ALLOW_CUDA_STANDIN=1. It is not part of the package.
//
// "Device memory" is host memory. A stream is a queue of operations (copies,
// event records) that one thread of the stand-in carries out late and out of
// step with the callers: after a random delay each, picking streams at
// random, or not at all while held. Any function can be made to fail on
// demand. The stand-in counts violations: a copy enqueued into, or a pinned
// block freed while, an earlier copy that touches its memory is pending.
// Its state is never destroyed, and its thread is detached: a process may
// exit with operations pending.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_api.h"

namespace {

using hcb::cuda::Error;
constexpr Error kSuccess = 0, kNotReady = 600;

struct Event {
  int64_t recorded = 0;   // generation of its last record
  int64_t completed = 0;  // generation its stream reached
};

struct Op {
  void* dst;
  const void* src;
  size_t bytes;    // a copy's
  Event* event;    // a record's (then no copy)
  int64_t generation;
};

struct Stream {
  std::deque<Op> ops;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;  // the worker waits for ops, callers for ends
  std::vector<Stream*> streams;
  bool hold = false;
  int delay_us = 0;
  std::mt19937 rng{12345};
  std::map<std::string, std::pair<int, Error>> failures;  // calls to go
  std::map<std::string, int64_t> calls;
  int64_t violations = 0;
  int64_t pending = 0;
  std::map<void*, size_t> host_blocks;  // pinned block -> bytes
};

State& S() {
  static State* state = new State();  // never destroyed
  return *state;
}

// Under S().mu: counts the call, and returns the failure asked for it.
Error Called(const char* name) {
  State& s = S();
  ++s.calls[name];
  auto it = s.failures.find(name);
  if (it == s.failures.end() || --it->second.first > 0) return kSuccess;
  const Error error = it->second.second;
  s.failures.erase(it);
  return error;
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Under S().mu: whether a pending copy touches [at, at + bytes).
bool Touched(const void* at, size_t bytes) {
  for (Stream* stream : S().streams) {
    for (const Op& op : stream->ops) {
      if (op.event == nullptr && (Overlaps(op.dst, op.bytes, at, bytes) ||
                                  Overlaps(op.src, op.bytes, at, bytes))) {
        return true;
      }
    }
  }
  return false;
}

void Work() {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mu);
  while (true) {
    std::vector<Stream*> ready;
    s.cv.wait(lock, [&] {
      ready.clear();
      if (s.hold) return false;
      for (Stream* stream : s.streams) {
        if (!stream->ops.empty()) ready.push_back(stream);
      }
      return !ready.empty();
    });
    Stream* stream = ready[s.rng() % ready.size()];
    const int delay = s.delay_us > 0 ? static_cast<int>(s.rng() % s.delay_us)
                                     : 0;
    const Op op = stream->ops.front();
    lock.unlock();
    if (delay > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    if (op.event == nullptr && op.bytes > 0) {
      std::memcpy(op.dst, op.src, op.bytes);
    }
    lock.lock();
    stream->ops.pop_front();
    if (op.event != nullptr) op.event->completed = op.generation;
    --s.pending;
    s.cv.notify_all();
  }
}

Error HostAlloc(void** host, size_t bytes, unsigned) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Error error = Called("cudaHostAlloc")) return error;
  *host = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (*host == nullptr) return 2;  // cudaErrorMemoryAllocation
  S().host_blocks[*host] = bytes;
  return kSuccess;
}

Error FreeHost(void* host) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Error error = Called("cudaFreeHost")) return error;
  if (Touched(host, S().host_blocks[host])) ++S().violations;
  S().host_blocks.erase(host);
  std::free(host);
  return kSuccess;
}

Error MemcpyAsync(void* dst, const void* src, size_t bytes, int,
                  hcb::cuda::Stream stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (Error error = Called("cudaMemcpyAsync")) return error;
  if (Touched(dst, bytes)) ++s.violations;  // its memory is still in use
  static_cast<Stream*>(stream)->ops.push_back({dst, src, bytes, nullptr, 0});
  ++s.pending;
  s.cv.notify_all();
  return kSuccess;
}

Error EventCreate(hcb::cuda::Event* event, unsigned) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Error error = Called("cudaEventCreateWithFlags")) return error;
  *event = new Event();
  return kSuccess;
}

Error EventRecord(hcb::cuda::Event event, hcb::cuda::Stream stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (Error error = Called("cudaEventRecord")) return error;
  Event* e = static_cast<Event*>(event);
  static_cast<Stream*>(stream)->ops.push_back(
      {nullptr, nullptr, 0, e, ++e->recorded});
  ++s.pending;
  s.cv.notify_all();
  return kSuccess;
}

Error EventQuery(hcb::cuda::Event event) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Error error = Called("cudaEventQuery")) return error;
  Event* e = static_cast<Event*>(event);
  return e->completed >= e->recorded ? kSuccess : kNotReady;
}

Error EventSynchronize(hcb::cuda::Event event) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mu);
  if (Error error = Called("cudaEventSynchronize")) return error;
  Event* e = static_cast<Event*>(event);
  const int64_t target = e->recorded;
  s.cv.wait(lock, [&] { return e->completed >= target; });
  return kSuccess;
}

Error EventDestroy(hcb::cuda::Event event) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Error error = Called("cudaEventDestroy")) return error;
  delete static_cast<Event*>(event);
  return kSuccess;
}

Error StreamSynchronize(hcb::cuda::Stream stream) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mu);
  if (Error error = Called("cudaStreamSynchronize")) return error;
  Stream* st = static_cast<Stream*>(stream);
  s.cv.wait(lock, [&] { return st->ops.empty(); });
  return kSuccess;
}

const char* ErrorName(Error error) {
  switch (error) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 600: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* ErrorString(Error error) {
  return error == 0 ? "no error" : "stand-in failure";
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void hcb_cuda_standin_fill(
    hcb::CudaApi* api) {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(Work).detach(); });
  api->cudaHostAlloc = HostAlloc;
  api->cudaFreeHost = FreeHost;
  api->cudaMemcpyAsync = MemcpyAsync;
  api->cudaEventCreateWithFlags = EventCreate;
  api->cudaEventRecord = EventRecord;
  api->cudaEventQuery = EventQuery;
  api->cudaEventSynchronize = EventSynchronize;
  api->cudaEventDestroy = EventDestroy;
  api->cudaStreamSynchronize = StreamSynchronize;
  api->cudaGetErrorName = ErrorName;
  api->cudaGetErrorString = ErrorString;
}

// The tests' controls (ctypes).
__attribute__((visibility("default"))) void* hcb_standin_stream() {
  std::lock_guard<std::mutex> lock(S().mu);
  S().streams.push_back(new Stream());
  return S().streams.back();
}

__attribute__((visibility("default"))) void hcb_standin_hold(int hold) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().hold = hold != 0;
  S().cv.notify_all();
}

__attribute__((visibility("default"))) void hcb_standin_delay_us(int us) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().delay_us = us;
}

// The `nth` next call of `name` (counting from 1) returns `error`.
__attribute__((visibility("default"))) void hcb_standin_fail(const char* name,
                                                             int nth,
                                                             int error) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().failures[name] = {nth, error};
}

__attribute__((visibility("default"))) long long hcb_standin_pending() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().pending;
}

__attribute__((visibility("default"))) long long hcb_standin_violations() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().violations;
}

__attribute__((visibility("default"))) long long hcb_standin_calls(
    const char* name) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().calls[name];
}

__attribute__((visibility("default"))) long long hcb_standin_host_blocks() {
  std::lock_guard<std::mutex> lock(S().mu);
  return static_cast<long long>(S().host_blocks.size());
}

}  // extern "C"
