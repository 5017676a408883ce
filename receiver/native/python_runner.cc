// The direct runner: see python_runner.h.

#include "python_runner.h"

#include <memory>
#include <unordered_map>
#include <vector>

#include "hub.h"
#include "packet.h"
#include "python_arguments.h"
#include "python_gil.h"
#include "python_limited.h"
#include "python_plain_tap.h"
#include "python_results.h"
#include "python_sites.h"

namespace hcb::python {
namespace {

PyObject* runner = nullptr;  // owned references, or null
PyObject* wire = nullptr;
PyObject* device_buffer = nullptr;
PyObject* consumers = nullptr;  // consumer id -> consumer: a dict, read only
PyObject* failed = nullptr;
PyObject* failed_queued = nullptr;
PyObject* run_slots = nullptr;  // device_id -> a queue's counts (a buffer)

// The counts of each device's queue that CallConsumer updates, by device
// id: the buffers of `run_slots`, exported until the runner changes.
// Guarded by the GIL.
std::unordered_map<int64_t, Py_buffer> slots_by_device;

// The kRunSlots counts of a device's queue; null with the exception set.
int64_t* RunSlots(int64_t device_id) {
  auto found = slots_by_device.find(device_id);
  if (found != slots_by_device.end()) {
    return static_cast<int64_t*>(found->second.buf);
  }
  PyObject* slots = PyObject_CallFunction(run_slots, "L",
                                          static_cast<long long>(device_id));
  if (slots == nullptr) return nullptr;
  Py_buffer view;
  const bool exported = ViewRunSlots(slots, &view);
  Py_DECREF(slots);
  if (!exported) return nullptr;
  slots_by_device.emplace(device_id, view);
  return static_cast<int64_t*>(view.buf);
}

void ReleaseRunSlots() {
  for (auto& [device_id, view] : slots_by_device) PyBuffer_Release(&view);
  slots_by_device.clear();
  Replace(&run_slots, nullptr);
}

// How many direct runs' runner calls the calling thread is inside (a host
// function may run JAX code that runs another): RunsHostFunctionHere.
thread_local int runner_calls_here = 0;

// `runner(entry, device_id, args[, outputs[, stream]])`: the stream only
// for a GPU's buffers. Null with the exception set.
PyObject* CallRunner(const Site& site, const DirectRequest& request,
                     PyObject* args, PyObject* outputs) {
  PyObject* device_id = PyLong_FromLongLong(request.device_id);
  PyObject* stream =
      request.gpu < 0
          ? nullptr
          : PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(
                reinterpret_cast<uintptr_t>(request.stream)));
  PyObject* results =
      device_id == nullptr || (request.gpu >= 0 && stream == nullptr)
          ? nullptr
          : PyObject_CallFunctionObjArgs(runner, site.entry, device_id, args,
                                         outputs, stream,
                                         nullptr);  // may end early
  Py_XDECREF(device_id);
  Py_XDECREF(stream);
  return results;
}

// A plain request's consumer (a tap's, or a call's with no lent buffers),
// called here, which costs less than the runner's Python frame: what the
// runner does, counted in the queue's slots as QueueRuns.begin (a queued
// tap's) or begin_direct and end count a Python route's run, and an
// exception goes through `failed(entry, error)`, which raises what the
// runner would. A consumer no longer registered goes to the runner, which
// raises the error.
PyObject* CallConsumer(const Site& site, const DirectRequest& request,
                       PyObject* args) {
  PyObject* consumer = PyDict_GetItemWithError(consumers, site.entry);
  if (consumer == nullptr) {
    return PyErr_Occurred() ? nullptr
                            : CallRunner(site, request, args, nullptr);
  }
  int64_t* slots = RunSlots(request.device_id);
  if (slots == nullptr) return nullptr;
  PyObject* device_id = PyLong_FromLongLong(request.device_id);
  if (device_id == nullptr) return nullptr;
  // Held for the run: the consumer is borrowed from the dict, which the run
  // may change, and StopCallingConsumers may drop `failed` meanwhile.
  PyObject* on_failure = request.queued ? failed_queued : failed;
  Py_INCREF(consumer);
  Py_INCREF(on_failure);
  PyObject* results =
      CountedCall(slots, request.queued, consumer, args, device_id);
  Py_DECREF(consumer);
  Py_DECREF(device_id);
  PyObject* value = results == nullptr ? TakeRaised() : nullptr;
  if (value != nullptr) {
    PyObject* none = PyObject_CallFunctionObjArgs(on_failure, site.entry,
                                                  value, nullptr);  // raises
    if (none != nullptr) {
      Py_DECREF(none);
      PyErr_SetString(PyExc_RuntimeError,
                      "host_callback: a host function failed");
    }
    Py_DECREF(value);
  }
  Py_DECREF(on_failure);
  return results;
}

DirectOutcome RunWithGil(const DirectRequest& request, std::string* error) {
  if (runner == nullptr) return DirectOutcome::kDeclined;
  std::shared_ptr<const Site> site = FindSite(request.site);
  if (site == nullptr) return DirectOutcome::kDeclined;
  if (site->columns.size() != request.num_args) return DirectOutcome::kDeclined;
  for (size_t i = 0; i < request.num_args; ++i) {
    if (site->columns[i].nbytes != request.args[i].bytes) {
      return DirectOutcome::kDeclined;  // the queue's decoder reports it
    }
  }
  const bool gpu = request.gpu >= 0;
  if (gpu && (device_buffer == nullptr || !TakesGpuBuffers(*site))) {
    return DirectOutcome::kDeclined;  // copied through host memory instead
  }
  // A Ctrl-C that arrived while the device ran belongs to this computation.
  if (PyErr_CheckSignals() < 0) return TakeException(error);
  std::vector<PyObject*> views, output_views, filled;
  const bool lends = gpu || LendsOutputs(*site, request);
  PyObject* args = gpu ? GpuBuffers(device_buffer, *site, request, false, &views)
                       : TakeArguments(*site, request, &views);
  PyObject* outputs =
      args == nullptr || !lends ? nullptr
      : gpu                     ? GpuBuffers(device_buffer, *site, request, true,
                                             &output_views)
                                : Outputs(request, &output_views);
  if (args == nullptr || (outputs == nullptr && lends)) {
    Py_XDECREF(args);
    bool kept;
    CheckViews(&views, &kept);
    CheckViews(&output_views, &kept);
    return TakeException(error);
  }
  ++runner_calls_here;
  PyObject* results = consumers != nullptr && !lends
                          ? CallConsumer(*site, request, args)
                          : CallRunner(*site, request, args, outputs);
  --runner_calls_here;
  if (gpu) {
    Py_DECREF(args);
  } else {
    ReturnArguments(*site, args);
  }
  Py_XDECREF(outputs);
  DirectOutcome outcome = DirectOutcome::kDone;
  if (results == nullptr) {
    outcome = TakeException(error);  // drops the traceback, and its frames
  } else {
    // A tap's results (none) are not looked at; a GPU run's consumer wrote
    // them into the lent buffers, on the stream.
    if (request.num_outputs > 0 && !gpu &&
        !WriteResults(wire, *site, results, request, error)) {
      outcome = DirectOutcome::kFailed;
    }
    if (outputs != nullptr && !gpu) CollectFilled(results, request, &filled);
    Py_DECREF(results);
  }
  // The filled results first: a kept one's own copy releases its lent bytes.
  bool kept, kept_filled, kept_output;
  CheckViews(&views, &kept);
  CheckViews(&filled, &kept_filled);
  CheckViews(&output_views, &kept_output);
  if ((kept || kept_filled || kept_output) &&
      outcome == DirectOutcome::kDone) {
    *error = KeptMessage(*site, gpu    ? Kept::kGpuBuffer
                                : kept ? Kept::kArgument
                                       : Kept::kOutput);
    outcome = DirectOutcome::kFailed;
  }
  return outcome;
}

}  // namespace

bool ViewRunSlots(PyObject* slots, Py_buffer* view) {
  if (PyObject_GetBuffer(slots, view, PyBUF_WRITABLE) < 0) return false;
  if (view->len != kRunSlots * static_cast<Py_ssize_t>(sizeof(int64_t))) {
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_ValueError, "run slots: not the counts' slots");
    return false;
  }
  return true;
}

PyObject* CountedCall(int64_t* slots, bool queued, PyObject* consumer,
                      PyObject* arrays, PyObject* device_id) {
  ++slots[kRunning];
  if (queued) ++slots[kBegunQueued];
  PyObject* results = RunConsumer(consumer, arrays, device_id);
  --slots[kRunning];
  ++slots[kRan];
  return results;
}

void SetRunner(PyObject* new_runner, PyObject* new_wire,
               PyObject* new_device_buffer, PyObject* new_consumers,
               PyObject* new_failed, PyObject* new_failed_queued,
               PyObject* new_run_slots) {
  if (new_consumers == nullptr || new_failed == nullptr ||
      new_failed_queued == nullptr || new_run_slots == nullptr) {
    new_consumers = new_failed = new_failed_queued = new_run_slots = nullptr;
  }
  for (PyObject* object :
       {new_runner, new_wire, new_device_buffer, new_consumers, new_failed,
        new_failed_queued, new_run_slots}) {
    Py_XINCREF(object);
  }
  ReleaseRunSlots();
  run_slots = new_run_slots;
  Replace(&runner, new_runner);
  Replace(&wire, new_wire);
  Replace(&device_buffer, new_device_buffer);
  Replace(&consumers, new_consumers);
  Replace(&failed, new_failed);
  Replace(&failed_queued, new_failed_queued);
}

void StopCallingConsumers() {
  Replace(&consumers, nullptr);
  Replace(&failed, nullptr);  // a run that holds it keeps its own reference
  Replace(&failed_queued, nullptr);
  ReleaseRunSlots();
}

bool RunsHostFunctionHere() { return runner_calls_here > 0; }

GuestOutcome RunWaitingTaps(int64_t device_id) {
  GilHeld gil;
  GuestOutcome outcome = GuestOutcome::kDone;
  DeviceQueue* queue = Hub::Get().Queue(device_id);
  // A packet's bytes, taken out of the queue: reused by the thread.
  thread_local std::vector<uint8_t> packet_bytes;
  int64_t site_id;
  while (consumers != nullptr && outcome == GuestOutcome::kDone &&
         queue->NextTapSite(&site_id)) {
    std::shared_ptr<const Site> site = FindSite(site_id);
    if (site == nullptr) break;  // the consumer thread drops and reports it
    std::vector<Span> args(site->columns.size());
    for (size_t i = 0; i < args.size(); ++i) {
      args[i].bytes = site->columns[i].nbytes;
    }
    const int64_t bytes = PacketSize(args.data(), args.size());
    if (static_cast<int64_t>(packet_bytes.size()) < bytes) {
      packet_bytes.resize(static_cast<size_t>(bytes));
    }
    IndexEntry index;
    int64_t needed;
    const DeviceQueue::Tap tap{site_id, bytes};
    if (queue->TakeAsGuest(packet_bytes.data(),
                           static_cast<int64_t>(packet_bytes.size()), &index,
                           &needed, &tap) != 1) {
      break;  // another thread took first, or may not be overtaken
    }
    int64_t offset = index.offset + kHeaderBytes;
    for (Span& arg : args) {
      arg.data = packet_bytes.data() + offset;
      offset += AlignUp(arg.bytes);
    }
    DirectRequest request{device_id, site_id, args.data(), args.size(),
                          nullptr, 0};
    request.queued = true;
    std::string error;  // a tap's own failure is recorded, and goes no further
    if (RunWithGil(request, &error) == DirectOutcome::kInterrupted) {
      outcome = GuestOutcome::kInterrupted;
    }
    queue->EndGuest();
  }
  return outcome;
}

DirectOutcome Run(const DirectRequest& request, std::string* error) {
  GilHeld gil;
  return RunWithGil(request, error);
}

}  // namespace hcb::python
