// What the last few dispatches on each thread output, as JAX's dispatch
// reports it (dispatches.h counts them): weak references to two arrays of
// each, for barrier_wait's idle check. No array that one execution
// outputs on a CPU is ready before the execution has ended, host functions
// included (XLA's CPU client marks them once its thunks have all run, one
// after another), so one of them being ready shows that the execution has
// finished: a barrier after a few dispatches whose arrays are all ready
// has nothing of theirs to wait for (idle_check.cc).

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

// Waits until this thread's dispatches numbered after `after`, up to
// `last`, have finished, blocking on a noted array of each that is alive
// (with the GIL released, as the array's block_until_ready does): 1 when
// it waited for each, 0 where one was not noted, its arrays are gone or
// its wait raised an Exception (cleared), -1 with another exception set
// (Ctrl-C's KeyboardInterrupt).
int AwaitDispatches(int64_t after, int64_t last);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_DISPATCHED_OUTPUTS_H_
