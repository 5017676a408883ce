// The few CUDA runtime entry points the CUDA transport uses, declared here
// (no CUDA header or toolkit at build time) and found at run time: a table
// of function pointers (CudaApi) that LoadCudaApi fills from libcudart,
// preferring the copy JAX's CUDA plugin already loaded (dlopen with
// RTLD_NOLOAD). The tests install a stand-in table instead
// (InstallCudaStandIn, tests/cuda_standin/), which completes copies and
// events on its own thread; no user's process loads it.
//
// The table is set once per process, before any CUDA handler runs, under
// a lock of this file's own; afterwards it is read without a lock by every
// thread (the device threads' handlers, the landing threads of
// cuda_copies.h, the consumer that frees a pinned block).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_CUDA_API_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_CUDA_API_H_

#include <cstddef>
#include <string>

#include "status.h"

namespace hcb {
namespace cuda {

// cudaError_t, cudaStream_t, cudaEvent_t as the CUDA runtime's ABI has them
// (an enum passed as int; opaque pointers).
using Error = int;
using Stream = void*;
using Event = void*;

// Values from cuda_runtime_api.h / driver_types.h (stable since CUDA 4).
constexpr Error kSuccess = 0;              // cudaSuccess
constexpr Error kNotReady = 600;           // cudaErrorNotReady
constexpr int kMemcpyHostToDevice = 1;     // cudaMemcpyHostToDevice
constexpr int kMemcpyDeviceToHost = 2;     // cudaMemcpyDeviceToHost
constexpr int kMemcpyDeviceToDevice = 3;   // cudaMemcpyDeviceToDevice
constexpr unsigned kHostAllocPortable = 1; // cudaHostAllocPortable
constexpr unsigned kEventBlockingSync = 1; // cudaEventBlockingSync
constexpr unsigned kEventDisableTiming = 2;  // cudaEventDisableTiming

}  // namespace cuda

// The entry points, by their CUDA runtime names (see LoadCudaApi).
struct CudaApi {
  cuda::Error (*cudaHostAlloc)(void** host, size_t bytes, unsigned flags);
  cuda::Error (*cudaFreeHost)(void* host);
  cuda::Error (*cudaMemcpyAsync)(void* dst, const void* src, size_t bytes,
                                 int kind, cuda::Stream stream);
  cuda::Error (*cudaEventCreateWithFlags)(cuda::Event* event, unsigned flags);
  cuda::Error (*cudaEventRecord)(cuda::Event event, cuda::Stream stream);
  cuda::Error (*cudaEventQuery)(cuda::Event event);
  cuda::Error (*cudaEventSynchronize)(cuda::Event event);
  cuda::Error (*cudaEventDestroy)(cuda::Event event);
  cuda::Error (*cudaStreamSynchronize)(cuda::Stream stream);
  const char* (*cudaGetErrorName)(cuda::Error error);
  const char* (*cudaGetErrorString)(cuda::Error error);
};

// The table in use, or null before one was loaded or installed.
const CudaApi* GetCudaApi();

// Fills the table from the CUDA runtime: a libcudart already in the process
// (RTLD_NOLOAD), else `path` when not null (the Python side finds the one
// of the `nvidia-cuda-runtime` wheel), else libcudart by its usual names.
// Fails, naming what it tried or the missing symbol, when none has them all;
// a table already set is kept.
Status LoadCudaApi(const char* path);

// Tests only: the table of the stand-in library at `path` (its function
// `hcb_cuda_standin_fill(CudaApi*)`), allowed only when the environment has
// HOST_CALLBACK_ALLOW_CUDA_STANDIN=1 and no real runtime was loaded.
Status InstallCudaStandIn(const char* path);

// A buffers=True call's result, copied on `stream` from the GPU memory a
// host function returned into the device's result buffer (python_runner.cc,
// through the module's cuda_copy_on_device). Fails naming the call.
Status CopyOnDevice(void* dst, const void* src, size_t bytes,
                    cuda::Stream stream);
// Waits for the work enqueued on `stream` (an array that a host function
// exports or returns was made on another stream). Fails naming the call.
Status SynchronizeStream(cuda::Stream stream);

// "host_callback: <call> failed (<cudaErrorName>: <description>) <what>":
// the message of a failed CUDA call.
std::string CudaFailure(const CudaApi& api, const char* call,
                        cuda::Error error, const char* what);

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_CUDA_API_H_
