// Which of the native core's calls are Linux-only, in one place: where
// HCB_LINUX_CALLS is 1 the core makes them (madvise's transparent huge
// pages, uname); where it is 0 it takes the portable branch beside each
// one, as on macOS. A build with HOST_CALLBACK_PORTABLE=1 (setup.py defines
// HCB_PORTABLE) takes the portable branches on Linux too, so that CI tests
// there the code a Mac runs.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PORTABILITY_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PORTABILITY_H_

#if defined(__linux__) && !defined(HCB_PORTABLE)
#define HCB_LINUX_CALLS 1
#else
#define HCB_LINUX_CALLS 0
#endif

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PORTABILITY_H_
