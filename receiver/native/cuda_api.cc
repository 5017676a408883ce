// The CUDA runtime's entry points found at run time: see cuda_api.h.

#include "cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hcb {
namespace {

std::mutex load_mu;            // guards the setting of `table`
CudaApi table_storage;         // written once, under `load_mu`
std::atomic<const CudaApi*> table{nullptr};
bool stand_in = false;         // `table` is the tests' stand-in

// libcudart by the names of the CUDA versions JAX ships plugins for.
constexpr const char* kRuntimeNames[] = {
    "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
};

// Resolves every entry point of `library` into `api`; false naming the
// first missing one in `missing`.
bool Resolve(void* library, CudaApi* api, std::string* missing) {
#define HCB_RESOLVE(name)                                                   \
  api->name = reinterpret_cast<decltype(api->name)>(dlsym(library, #name)); \
  if (api->name == nullptr) {                                               \
    *missing = #name;                                                       \
    return false;                                                           \
  }
  HCB_RESOLVE(cudaHostAlloc)
  HCB_RESOLVE(cudaFreeHost)
  HCB_RESOLVE(cudaMemcpyAsync)
  HCB_RESOLVE(cudaEventCreateWithFlags)
  HCB_RESOLVE(cudaEventRecord)
  HCB_RESOLVE(cudaEventQuery)
  HCB_RESOLVE(cudaEventSynchronize)
  HCB_RESOLVE(cudaEventDestroy)
  HCB_RESOLVE(cudaStreamSynchronize)
  HCB_RESOLVE(cudaGetErrorName)
  HCB_RESOLVE(cudaGetErrorString)
#undef HCB_RESOLVE
  return true;
}

// Under `load_mu`: sets the table from `library`.
Status Use(void* library, const std::string& name) {
  std::string missing;
  CudaApi api;
  if (!Resolve(library, &api, &missing)) {
    return Failure(Code::kNotFound, "host_callback: " + name + " has no " +
                                        missing + "; the CUDA transport "
                                        "needs CUDA 11 or later");
  }
  table_storage = api;
  table.store(&table_storage, std::memory_order_release);
  return Status();
}

}  // namespace

const CudaApi* GetCudaApi() { return table.load(std::memory_order_acquire); }

Status LoadCudaApi(const char* path) {
  std::lock_guard<std::mutex> lock(load_mu);
  if (table.load(std::memory_order_relaxed) != nullptr) {
    if (!stand_in) return Status();
    return Failure(Code::kFailedPrecondition,
                   "host_callback: the tests' CUDA stand-in is installed in "
                   "this process; the CUDA runtime cannot be loaded");
  }
  for (const char* name : kRuntimeNames) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) {
      return Use(library, name);
    }
  }
  if (path != nullptr && *path != '\0') {
    if (void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
      return Use(library, path);
    }
  }
  for (const char* name : kRuntimeNames) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      return Use(library, name);
    }
  }
  return Failure(Code::kNotFound,
                 "host_callback: the CUDA runtime (libcudart.so.13, .12 or "
                 ".11.0) is neither loaded nor found; install JAX's CUDA "
                 "plugin (pip install 'jax[cuda12]') or use "
                 "JAX_HOST_CALLBACK_TRANSPORT=python");
}

Status InstallCudaStandIn(const char* path) {
  const char* allowed = std::getenv("HOST_CALLBACK_ALLOW_CUDA_STANDIN");
  if (allowed == nullptr || std::strcmp(allowed, "1") != 0) {
    return Failure(Code::kFailedPrecondition,
                   "host_callback: the CUDA stand-in is for host_callback's "
                   "tests only (HOST_CALLBACK_ALLOW_CUDA_STANDIN=1)");
  }
  std::lock_guard<std::mutex> lock(load_mu);
  if (table.load(std::memory_order_relaxed) != nullptr) {
    if (stand_in) return Status();  // installed once per process
    return Failure(Code::kFailedPrecondition,
                   "host_callback: the CUDA runtime is loaded; the stand-in "
                   "cannot replace it");
  }
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return Failure(Code::kNotFound,
                   std::string("host_callback: cannot load the CUDA "
                               "stand-in: ") + dlerror());
  }
  using Fill = void (*)(CudaApi*);
  auto fill = reinterpret_cast<Fill>(dlsym(library, "hcb_cuda_standin_fill"));
  if (fill == nullptr) {
    return Failure(Code::kNotFound, std::string("host_callback: ") + path +
                                        " is not the CUDA stand-in");
  }
  fill(&table_storage);
  stand_in = true;
  table.store(&table_storage, std::memory_order_release);
  return Status();
}

std::string CudaFailure(const CudaApi& api, const char* call,
                        cuda::Error error, const char* what) {
  const char* name = api.cudaGetErrorName(error);
  const char* text = api.cudaGetErrorString(error);
  return std::string("host_callback: ") + call + " failed (" +
         (name != nullptr ? name : "?") + ": " +
         (text != nullptr ? text : "?") + ") " + what;
}

namespace {

Status NoRuntime() {
  return Failure(Code::kFailedPrecondition,
                 "host_callback: a GPU buffer was used before the CUDA "
                 "runtime was loaded");
}

}  // namespace

Status CopyOnDevice(void* dst, const void* src, size_t bytes,
                    cuda::Stream stream) {
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) return NoRuntime();
  const cuda::Error error = api->cudaMemcpyAsync(
      dst, src, bytes, cuda::kMemcpyDeviceToDevice, stream);
  if (error == cuda::kSuccess) return Status();
  return Failure(Code::kInternal,
                 CudaFailure(*api, "cudaMemcpyAsync", error,
                             "copying a buffers=True call's result on the "
                             "GPU"));
}

Status SynchronizeStream(cuda::Stream stream) {
  const CudaApi* api = GetCudaApi();
  if (api == nullptr) return NoRuntime();
  const cuda::Error error = api->cudaStreamSynchronize(stream);
  if (error == cuda::kSuccess) return Status();
  return Failure(Code::kInternal,
                 CudaFailure(*api, "cudaStreamSynchronize", error,
                             "waiting for a GPU buffer's stream"));
}

}  // namespace hcb
