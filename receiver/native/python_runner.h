// The direct path: a request (a `call`, or a tap in the synchronous mode)
// whose device queue is idle runs its host function on the device thread.
// The runner takes the GIL, builds the NumPy arguments itself (copies, or
// read-only views of the device's buffers for a site registered with
// copy=False), calls Python once, and writes the results straight into the
// device's result buffers. A copy=False site's call is also lent those
// result buffers, as writable bytes, which its consumer may fill in place
// (buffers=True with out=) and return: a result that is its output buffer
// is not copied, so no copy either way. A buffers=True site's call on a
// GPU gets that GPU's buffers and stream instead (SetRunner).
//
// The runner is called on the device's thread by DirectRuns::TryRun
// (direct_runs.h); it takes the GIL, which guards its Python objects and
// the sites it serves (python_sites.h).

#ifndef HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
#define HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>

#include "direct_runs.h"

namespace hcb::python {

// `runner(entry, device_id, args[, outputs[, stream]])` runs a site's host
// function (`entry` is what the site was registered with, `args` a tuple
// of arrays, `outputs` the lent result buffers) and returns its results
// (None for none; views of `outputs` that it filled count as written) or
// raises; `wire(array)` returns a result as the device stores it
// (C-contiguous, sub-byte dtypes packed). For a buffers=True site's call
// on a GPU, `device_buffer(address, dtype, shape, gpu, stream, writable)`
// makes each of `args` (read-only) and `outputs` (writable bytes) over the
// GPU's memory (receiver/device_buffers.py:CudaBuffer), the runner also
// gets `stream` (the cudaStream_t as an int), and its consumer writes the
// results into `outputs` on that stream: nothing is copied here. A kept
// GPU buffer is released (it exports nothing more) and fails the run.
// With `consumers` (a dict: entry -> consumer) and `failed`, a request
// that is lent no buffers (every tap's) skips the runner's Python frame:
// its consumer is called here as `consumer(args, device_id)`, the run
// counted in the queue's slots (`run_slots(device_id)`, a writable buffer
// of kRunSlots int64s: receiver/run_counts.py:QueueRuns.slots), and an
// exception goes to `failed(entry, error)`, which raises what the runner
// would have. Any of those null: the runner runs every request. The first
// three null: no direct runs. Needs the GIL.
// `failed_queued(entry, error)` is `failed` for a tap that waited on its
// queue and that a later request ran (RunWaitingTaps): it records the
// error for the barrier and returns, or raises a KeyboardInterrupt of
// Ctrl-C, which cancels the request.
void SetRunner(PyObject* runner, PyObject* wire, PyObject* device_buffer,
               PyObject* consumers, PyObject* failed, PyObject* failed_queued,
               PyObject* run_slots);

// From now on every request goes to the runner (which refuses them once the
// process ends): `consumers`, `failed` and `run_slots` are dropped. Needs
// the GIL.
void StopCallingConsumers();

// The slots of a queue's counts, int64 each (receiver/run_counts.py:
// QueueRuns.slots, whose RAN, RUNNING, BEGUN_QUEUED, REFUSED these are).
enum RunSlot : int { kRan, kRunning, kBegunQueued, kRefused, kRunSlots };

// Exports `slots` (a QueueRuns.slots) into `view`, writable; false with an
// exception set where it is not kRunSlots int64s. Release with
// PyBuffer_Release.
bool ViewRunSlots(PyObject* slots, Py_buffer* view);

// `consumer(arrays, device_id)`, counted in `slots` as QueueRuns.begin (a
// `queued` packet's) or begin_direct and then end count a Python route's
// run; null with the exception set where it raised.
PyObject* CountedCall(int64_t* slots, bool queued, PyObject* consumer,
                      PyObject* arrays, PyObject* device_id);

// Whether the calling thread runs a host function for a direct run now,
// so that a barrier called from it would wait for itself. The runner keeps
// this itself, so the Python runner marks nothing per run.
bool RunsHostFunctionHere();

// The DirectRunner (direct_runs.h); takes the GIL.
DirectOutcome Run(const DirectRequest& request, std::string* error);

// The GuestConsumer (direct_runs.h); takes the GIL. Runs the taps that wait
// first on the queue of `device_id`, each written in the queue's chunks to
// a site it knows, as a direct run of the same consumer (counted here),
// until another kind of packet comes first or the queue may not be taken
// (DeviceQueue::TakeAsGuest); the consumer thread runs the rest. Nothing
// once the process ends (StopCallingConsumers).
GuestOutcome RunWaitingTaps(int64_t device_id);

}  // namespace hcb::python

#endif  // HOST_CALLBACK_RECEIVER_NATIVE_PYTHON_RUNNER_H_
