// What the last few dispatches on each thread output, as JAX's dispatch
// reports it (dispatches.h counts them): weak references to two arrays of
// each, for barrier_wait's idle check. Every array that one execution
// outputs on a CPU is defined by the same event, the execution's end, so
// one of them being ready shows that the execution has finished, host
// functions included: a barrier after a few dispatches whose arrays are
// all ready has nothing of theirs to wait for (idle_check.cc).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHED_OUTPUTS_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHED_OUTPUTS_H_

#include "python_limited.h"

#include <cstdint>

namespace hcb::python {

// The most dispatches since the last barrier that the check follows.
inline constexpr int64_t kDispatchesFollowed = 8;

// The type of the arrays a dispatch outputs (a strong reference, replaced
// by a later call); until it is set no output is noted.
void SetDispatchedArrayType(PyObject* type);

// Notes `output`, the output of this thread's dispatch numbered `number`
// (Dispatches::OnThisThread() after it): weak references to its first and
// its last array, or that it has none. Never raises.
void NoteDispatchedOutput(PyObject* output, int64_t number);

// Whether this thread's dispatches numbered after `after`, up to `last`,
// are each known to have finished: a noted array of each is alive and
// ready.
// Never raises; an array that cannot tell (deleted, say) counts as not
// finished.
bool DispatchesFinished(int64_t after, int64_t last);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHED_OUTPUTS_H_
