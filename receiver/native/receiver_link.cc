// The device side's link to the Python receiver: see receiver_link.h.

#include "receiver_link.h"

#include <string>

namespace hcb {

Status ReceiverLink::Restart(int64_t device_id) {
  RestartHook hook = restart_hook_.load(std::memory_order_seq_cst);
  if (hook != nullptr && hook() == 0) return Status();
  return Failure(Code::kUnavailable,
                 "host_callback: device " + std::to_string(device_id) +
                     " needs the host_callback receiver, which is stopped "
                     "and cannot start again (the interpreter is exiting?)");
}

}  // namespace hcb
