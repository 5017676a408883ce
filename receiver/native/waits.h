// How the native core's threads wait: brief polling before sleeping (a futex
// wake-up costs more than a packet), and the interval at which every sleep
// re-checks its way out (a stopped receiver, Ctrl-C). Header only, no state.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_WAITS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_WAITS_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace hcb {

using Clock = std::chrono::steady_clock;

// Every wait re-checks its way out at least this often.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

// One turn of a spin: the CPU's spin-wait hint (x86's `pause`, aarch64's
// `yield`), which slows the loop and gives way to a sibling hardware thread;
// elsewhere the OS's yield, a system call.
inline void Relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#else
  std::this_thread::yield();
#endif
}

// Polls `done()` for up to `budget`; true if it became true. Pauses between
// polls keep the polled cache line with its writer.
template <typename Done>
bool Spin(std::chrono::microseconds budget, Done done) {
  const auto deadline = Clock::now() + budget;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 7) == 7 && Clock::now() >= deadline) return false;
    for (int j = 0; j < 4; ++j) Relax();
  }
}

// Locks `mu`, first polling it briefly: the other side holds it for well
// under a microsecond, far less than sleeping on it costs.
inline std::unique_lock<std::mutex> LockSoon(std::mutex& mu) {
  std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
  for (int i = 0; i < 256 && !lock.owns_lock(); ++i) {
    Relax();
    lock.try_lock();
  }
  if (!lock.owns_lock()) lock.lock();
  return lock;
}

inline std::chrono::microseconds Seconds(double s) {
  return std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_WAITS_H_
