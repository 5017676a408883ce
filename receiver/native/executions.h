// The executions of host_callback's computations that began and have not
// finished, counted on the device side for barrier_wait.
//
// Each such computation begins with host_callback_begin and ends with
// host_callback_end (the first and last ops on our ordering token, on every
// device it runs on). An execution that one of our ops fails ends there: the
// handler that fails counts it as ended. barrier_wait waits for a moment when
// no more than the abandoned executions (those a foreign op failed, which
// never end) are in flight: every execution that began before that moment
// has then sent all its packets.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_EXECUTIONS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_EXECUTIONS_H_

#include <atomic>
#include <cstdint>
#include <limits>

namespace hcb {

class Executions {
 public:
  static Executions& Get() {
    static Executions* executions = new Executions();  // never destroyed
    return *executions;
  }

  void Begin() {
    begun_.fetch_add(1, std::memory_order_relaxed);
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }

  void End() {
    const int64_t left = in_flight_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    int64_t low = low_water_.load(std::memory_order_relaxed);
    while (left < low && !low_water_.compare_exchange_weak(
                             low, left, std::memory_order_acq_rel)) {
    }
  }

  // Starts a new low-water mark of the executions in flight.
  void ResetLowWater() {
    low_water_.store(std::numeric_limits<int64_t>::max(),
                     std::memory_order_release);
  }

  // Executions in flight now.
  int64_t InFlight() const { return in_flight_.load(std::memory_order_acquire); }

  // Executions begun ever, in flight now, and the fewest in flight right
  // after an execution ended since the last ResetLowWater.
  void Read(int64_t* out) const {
    out[0] = begun_.load(std::memory_order_acquire);
    out[1] = InFlight();
    out[2] = low_water_.load(std::memory_order_acquire);
  }

 private:
  Executions() = default;
  std::atomic<int64_t> begun_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> low_water_{std::numeric_limits<int64_t>::max()};
};

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_EXECUTIONS_H_
