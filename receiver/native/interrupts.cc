// Ctrl-C for the native core: see interrupts.h.

#include "interrupts.h"

#include <pthread.h>

namespace hcb {
namespace {

// Comparable with the `threading.main_thread().ident` Python passes in (a
// C-style cast, as pthread_t is an integer or a pointer by platform).
uint64_t ThisThread() { return (uint64_t)pthread_self(); }

}  // namespace

void Interrupts::Set(InterruptHook hook, Rearm rearm, uint64_t main_thread) {
  main_thread_.store(main_thread, std::memory_order_seq_cst);
  rearm_.store(rearm, std::memory_order_seq_cst);
  hook_.store(hook, std::memory_order_seq_cst);
}

bool Interrupts::OnMainThread() {
  return ThisThread() == main_thread_.load(std::memory_order_seq_cst);
}

bool Interrupts::Interrupted() {
  InterruptHook hook = hook_.load(std::memory_order_seq_cst);
  return hook != nullptr && OnMainThread() && hook() != 0;
}

void Interrupts::RearmOnMainThread() {
  if (!OnMainThread()) return;
  if (Rearm rearm = rearm_.load(std::memory_order_seq_cst)) rearm();
}

Status Interrupts::Cancel(const std::string& where) {
  RearmOnMainThread();
  cancellations_.fetch_add(1, std::memory_order_seq_cst);
  return Failure(Code::kCancelled, std::string(kCtrlCCancelled) + " " + where);
}

}  // namespace hcb
