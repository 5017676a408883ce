// The byte size of each array that a callback site's packets carry, as
// register_site gave them, so that a device whose arrays XLA laid out
// otherwise fails instead of sending what the decoder would misread. A copy
// of the site table that receiver/native_sites.py owns (it lays the arrays
// out), which only the module's register_site and unregister_site write;
// tests/test_native_sites.py checks it against the owner.
//
// The extension module registers and forgets sites with the GIL; device
// threads check their arrays (the FFI handlers, ffi_common.h:SiteArgs).
// It also keeps, for a GPU's call (hub.cc:Hub::CudaCall), whether a site's
// host function takes the device's buffers (buffers=True). `mu_` (shared
// for checks) guards `sites_`.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_SITE_SIZES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_SITE_SIZES_H_

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "packet.h"
#include "status.h"

namespace hcb {

class SiteSizes {
 public:
  // Records the byte size of each array that the packets of `site` carry,
  // and whether its host function takes the device's buffers.
  void Register(int64_t site, std::vector<int64_t> array_bytes, bool buffers);
  // Forgets a site; a device that sends to it from now on fails. Returns
  // whether it was registered.
  bool Unregister(int64_t site);
  // Empty when `arrays` are what `site` expects; else NOT_FOUND (no such
  // site) or INVALID_ARGUMENT (other sizes).
  Status Check(int64_t site, const Span* arrays, size_t num_arrays);
  // Whether `site` is registered with buffers=True.
  bool TakesBuffers(int64_t site);

 private:
  struct Entry {
    std::vector<int64_t> sizes;
    bool buffers;
  };
  std::shared_mutex mu_;
  std::unordered_map<int64_t, Entry> sites_;
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_SITE_SIZES_H_
