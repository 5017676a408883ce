// Advice to the kernel about the CPU device's result buffers that a call
// writes (its host function filling `out=`, or our copy of its results).
//
// XLA's CPU buffers of a few MiB and more are fresh anonymous memory, so
// the first write into one faults once per 4 KiB page: for 256 MiB that is
// about half the time of the write. NumPy advises transparent huge pages
// for its own arrays of 4 MiB and more, and so do we for these buffers,
// under the same conditions: a write then faults once per 2 MiB, as it would
// into a NumPy array (a 256 MiB fill: about 200 ms -> 100 ms on 2 cores).
// The advice changes no data; where the kernel lacks it, it is not given.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_HUGE_PAGES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_HUGE_PAGES_H_

#include <cstddef>

namespace hcb {

// NumPy's threshold (numpy/_core/src/multiarray/alloc.c).
constexpr size_t kHugePagesFrom = size_t{1} << 22;

// Advises huge pages for the whole pages of [data, data + bytes), where the
// span has at least kHugePagesFrom bytes and the kernel takes the advice
// (Linux 4.6 and later, as NumPy requires). Failures are ignored: the
// advice only changes speed.
void AdviseHugePages(void* data, size_t bytes);

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_HUGE_PAGES_H_
