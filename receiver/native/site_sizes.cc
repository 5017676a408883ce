// The array sizes of callback sites: see site_sizes.h.

#include "site_sizes.h"

#include <mutex>
#include <string>
#include <utility>

namespace hcb {

void SiteSizes::Register(int64_t site, std::vector<int64_t> array_bytes,
                         bool buffers) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  sites_[site] = Entry{std::move(array_bytes), buffers};
}

bool SiteSizes::Unregister(int64_t site) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  return sites_.erase(site) > 0;
}

Status SiteSizes::Check(int64_t site, const Span* arrays, size_t num_arrays) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = sites_.find(site);
  if (it == sites_.end()) {
    return Failure(Code::kNotFound,
                   "host_callback: callback site " + std::to_string(site) +
                       " is not registered (its host function was "
                       "garbage-collected?)");
  }
  const std::vector<int64_t>& expected = it->second.sizes;
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

bool SiteSizes::TakesBuffers(int64_t site) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = sites_.find(site);
  return it != sites_.end() && it->second.buffers;
}

}  // namespace hcb
