#include "huge_pages.h"

#include <cstdint>
#include <cstdio>

#include "portability.h"

#if HCB_LINUX_CALLS
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>
#endif

namespace hcb {
namespace {

#if HCB_LINUX_CALLS && defined(MADV_HUGEPAGE)
// Whether the running kernel is 4.6 or later: older ones stall on the
// advice (NumPy's reason for the same check).
bool KernelTakesAdvice() {
  struct utsname name;
  int major = 0;
  int minor = 0;
  if (uname(&name) != 0 ||
      std::sscanf(name.release, "%d.%d", &major, &minor) != 2) {
    return false;
  }
  return major > 4 || (major == 4 && minor >= 6);
}
#endif

}  // namespace

void AdviseHugePages(void* data, size_t bytes) {
#if HCB_LINUX_CALLS && defined(MADV_HUGEPAGE)
  static const bool kernel_takes_advice = KernelTakesAdvice();
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (bytes < kHugePagesFrom || !kernel_takes_advice) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + bytes) / page * page;
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace hcb
