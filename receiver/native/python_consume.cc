// A receiver thread's taps in C (run_taken): the packets it took from a
// device's queue, run from the left as receiver/runner.py:run_queued runs
// them, without its Python frames: each consumer's run counted in the
// queue's slots (python_runner.h:RunSlot, as QueueRuns.begin and end), its
// error handed to `failed`, and `mark_finished(device_id, packet)` after
// each, or `mark_count_finished(device_id, count)` once for those it ran
// where that is not None. It stops at the first packet it does not run
// that way: one that waits for a reply (a call's), whose consumer is gone,
// or once the counts are closed (the process ends); Python's run_queued
// runs that one.

// And tap_packets: a run of a batch's tap packets of one site, decoded
// into Packets (receiver/native_decode.py:decode's common case), as
// decode would make them: a tuple of views of each packet's bytes.

#include "module_support.h"

#include <cstdint>
#include <memory>

#include "packet.h"
#include "python_arguments.h"
#include "python_instances.h"
#include "python_limited.h"
#include "python_runner.h"
#include "python_sites.h"

namespace hcb::python {
namespace {

// Attribute names, interned once.
PyObject* kReply = nullptr;
PyObject* kConsumerId = nullptr;
PyObject* kArrays = nullptr;
PyObject* kClosed = nullptr;

bool InternNames() {
  if (kReply != nullptr) return true;
  kReply = PyUnicode_InternFromString("reply");
  kConsumerId = PyUnicode_InternFromString("consumer_id");
  kArrays = PyUnicode_InternFromString("arrays");
  kClosed = PyUnicode_InternFromString("closed");
  return kReply != nullptr && kConsumerId != nullptr && kArrays != nullptr &&
         kClosed != nullptr;
}

// The consumer of `packet` when this loop may run it (a new reference);
// null without an exception when Python's run_queued must.
PyObject* PlainConsumer(PyObject* packet, PyObject* consumers,
                        PyObject* counts) {
  PyObject* closed = PyObject_GetAttr(counts, kClosed);
  if (closed == nullptr) return nullptr;
  const int is_closed = PyObject_IsTrue(closed);
  Py_DECREF(closed);
  if (is_closed != 0) return nullptr;
  PyObject* reply = PyObject_GetAttr(packet, kReply);
  if (reply == nullptr) return nullptr;
  Py_DECREF(reply);  // only compared
  if (reply != Py_None) return nullptr;
  PyObject* consumer_id = PyObject_GetAttr(packet, kConsumerId);
  if (consumer_id == nullptr) return nullptr;
  PyObject* consumer = PyDict_GetItemWithError(consumers, consumer_id);
  Py_DECREF(consumer_id);
  Py_XINCREF(consumer);
  return consumer;
}

// `mark(device_id, what)` after a run; false with an exception set when
// the run failed (`ran` false: its exception is kept) or `mark` raised.
bool MarkFinished(bool ran, PyObject* mark, PyObject* device_id,
                  PyObject* what) {
  PyObject *error_type = nullptr, *error_value = nullptr, *traceback = nullptr;
  if (!ran) PyErr_Fetch(&error_type, &error_value, &traceback);
  PyObject* finished =
      PyObject_CallFunctionObjArgs(mark, device_id, what, nullptr);
  if (!ran) {
    Py_XDECREF(finished);
    if (finished == nullptr) PyErr_Clear();
    PyErr_Restore(error_type, error_value, traceback);
    return false;
  }
  if (finished == nullptr) return false;
  Py_DECREF(finished);
  return true;
}

// Runs one packet, already taken off `taken`, and marks it finished unless
// `mark_finished` is null (the caller counts it); false with an exception
// set when `failed` or `mark_finished` raised.
bool RunOne(PyObject* packet, PyObject* consumer, int64_t* slots,
            PyObject* device_id, PyObject* failed, PyObject* mark_finished) {
  PyObject* arrays = PyObject_GetAttr(packet, kArrays);
  if (arrays == nullptr) return false;
  PyObject* result = CountedCall(slots, /*queued=*/true, consumer, arrays,
                                 device_id);
  Py_DECREF(arrays);
  bool ok = true;
  if (result == nullptr) {
    PyObject* error = TakeRaised();
    PyObject* recorded =
        error == nullptr ? nullptr : CallOne(failed, error);
    Py_XDECREF(error);
    ok = recorded != nullptr;
    Py_XDECREF(recorded);
  } else {
    Py_DECREF(result);
  }
  if (mark_finished == nullptr) return ok;
  return MarkFinished(ok, mark_finished, device_id, packet);
}

// run_taken(taken, popleft, consumers, counts, slots, failed, mark_finished,
// mark_count_finished, device_id): see the top. `taken` is the deque,
// `popleft` its method, `consumers` the registry's table, `counts` the
// RunCounts (its `closed`), `slots` the queue's QueueRuns.slots.
PyObject* RunTaken(PyObject* /*module*/, PyObject* args) {
  PyObject *taken, *popleft, *consumers, *counts, *slots_object, *failed,
      *mark_finished, *mark_count, *device_id;
  if (!PyArg_ParseTuple(args, "OOO!OOOOOO:run_taken", &taken, &popleft,
                        &PyDict_Type, &consumers, &counts, &slots_object,
                        &failed, &mark_finished, &mark_count, &device_id) ||
      !InternNames()) {
    return nullptr;
  }
  Py_buffer view;
  if (!ViewRunSlots(slots_object, &view)) return nullptr;
  auto* slots = static_cast<int64_t*>(view.buf);
  const bool counting = mark_count != Py_None;
  long long ran = 0;  // counting: the packets run and not marked yet
  bool ok = true;
  while (ok && PyObject_Length(taken) > 0) {
    PyObject* packet = PySequence_GetItem(taken, 0);
    if (packet == nullptr) {
      ok = false;
      break;
    }
    PyObject* consumer = PlainConsumer(packet, consumers, counts);
    if (consumer == nullptr) {
      Py_DECREF(packet);
      ok = !PyErr_Occurred();
      break;  // Python's run_queued runs it (or the error goes up)
    }
    PyObject* popped = PyObject_CallObject(popleft, nullptr);  // `packet`
    Py_XDECREF(popped);
    ok = popped != nullptr &&
         RunOne(packet, consumer, slots, device_id, failed,
                counting ? nullptr : mark_finished);
    if (popped != nullptr && counting) ++ran;
    Py_DECREF(consumer);
    Py_DECREF(packet);  // a large packet's memory returns to its pool now
  }
  if (ran > 0) {
    PyObject* count = PyLong_FromLongLong(ran);
    ok = count != nullptr && MarkFinished(ok, mark_count, device_id, count);
    Py_XDECREF(count);
  }
  PyBuffer_Release(&view);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// tap_packets(packet_type, consumer_id, device_id, site_id, data, offset,
// count, read_only) -> a list of `count` Packets (consumer_id, device_id,
// arrays, None) of the tap packets of site `site_id` that lie one after
// the other from `offset` in the bytes of `data` (a batch's buffer, which
// the arrays hold); None where the site is unknown here or has a column
// packed below a byte (decode makes those).
PyObject* TapPackets(PyObject* /*module*/, PyObject* args) {
  PyObject *type, *consumer_id, *device_id, *data;
  long long site_id, offset, count;
  int read_only;
  if (!PyArg_ParseTuple(args, "O!OOLOLLp:tap_packets", &PyType_Type, &type,
                        &consumer_id, &device_id, &site_id, &data, &offset,
                        &count, &read_only)) {
    return nullptr;
  }
  std::shared_ptr<const Site> site = FindSite(site_id);
  bool plain = site != nullptr;
  int64_t stride = kHeaderBytes;
  for (size_t i = 0; plain && i < site->columns.size(); ++i) {
    plain = site->columns[i].unpack == nullptr;
    stride += AlignUp(site->columns[i].nbytes);
  }
  if (!plain) Py_RETURN_NONE;
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return nullptr;
  if (offset < 0 || count < 0 || offset + count * stride > view.len) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "tap_packets: past the batch's bytes");
    return nullptr;
  }
  auto* bytes = static_cast<uint8_t*>(view.buf) + offset;
  PyObject* packets = PyList_New(static_cast<Py_ssize_t>(count));
  for (long long i = 0; packets != nullptr && i < count; ++i) {
    PyObject* arrays =
        PacketArguments(*site, bytes + i * stride, read_only != 0, data);
    PyObject* const values[] = {consumer_id, device_id, arrays, Py_None};
    PyObject* packet =
        arrays == nullptr
            ? nullptr
            : NewSlotsInstance(reinterpret_cast<PyTypeObject*>(type), values,
                               4);
    Py_XDECREF(arrays);
    if (packet == nullptr) {
      Py_CLEAR(packets);
    } else {
      PyList_SetItem(packets, static_cast<Py_ssize_t>(i), packet);
    }
  }
  PyBuffer_Release(&view);
  return packets;
}

}  // namespace

PyMethodDef kConsumeMethods[] = {
    {"run_taken", RunTaken, METH_VARARGS, nullptr},
    {"tap_packets", TapPackets, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace hcb::python
