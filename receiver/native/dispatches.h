// Dispatches of computations, counted as JAX's dispatch reports them (a
// hook that the Python side installs), for barrier_wait's idle check: a
// barrier that finds no dispatch since the last one that waited, on its
// own thread (and on any thread, where computations over several devices
// may be pending), no execution in flight and every queue drained has
// nothing to wait for.

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHES_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHES_H_

#include <atomic>
#include <cstdint>

namespace hcb {

class Dispatches {
 public:
  static Dispatches& Get() {
    static Dispatches* dispatches = new Dispatches();  // never destroyed
    return *dispatches;
  }

  void Note() {
    ++on_this_thread_;
    all_.fetch_add(1, std::memory_order_acq_rel);
  }

  // Dispatches noted ever on the calling thread, and on all threads.
  int64_t OnThisThread() const { return on_this_thread_; }
  int64_t All() const { return all_.load(std::memory_order_acquire); }

 private:
  Dispatches() = default;
  static thread_local int64_t on_this_thread_;
  std::atomic<int64_t> all_{0};
};

inline thread_local int64_t Dispatches::on_this_thread_ = 0;

}  // namespace hcb

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHES_H_
