"""The native transport: C++ XLA FFI handlers put packets on per-device queues.

The device runs `HcbOutfeed` (taps), `HcbTapSync` (synchronous taps) and
`HcbCall` (calls) from the extension module built from `receiver/native/`
(`native_library`). A tap copies its arrays into a packet on the device's
queue and goes on, without touching Python. A request (a call or a
synchronous tap) whose queue is idle runs its host function right there, on
the device thread (the direct path, `native/python_runner.h`); otherwise it
is queued like a tap and waits for its reply. This module implements the
`Transport` protocol for the receiver's threads: they take packets in
batches, decode them into NumPy views (`native_decode`), and post the
replies of requests back to the waiting device.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import device_buffers, native_sites, native_wire
from .native_decode import decode
from .native_library import native
# What the JAX side needs besides the Transport, to emit the native ops and
# count their executions (host_callback/ reaches the native module only
# through this module): see native_library for each.
from .native_library import (
    BEGIN_TARGET, CALL_TARGET, END_TARGET, OUTFEED_TARGET, TAP_SYNC_TARGET,
    available, configure_idle_check, cuda_ffi_handlers, dispatch_hook,
    execution_failed, executions, ffi_handlers, idle_barrier, idle_check,
    idle_check_begin, idle_check_forget, idle_check_waited, load_cuda_runtime,
    plain_tap, reset_executions_low_water)
from .native_memory import BatchBuffer
from .packets import POLL_SECONDS, DirectRunParts, Packet
from .transport import QueueStats

__all__ = [
    "NativeTransport", "BEGIN_TARGET", "CALL_TARGET", "END_TARGET",
    "OUTFEED_TARGET", "TAP_SYNC_TARGET", "available", "configure_idle_check",
    "cuda_ffi_handlers", "dispatch_hook", "execution_failed", "executions",
    "ffi_handlers", "idle_barrier", "idle_check", "idle_check_begin",
    "idle_check_forget", "idle_check_waited",
    "load_cuda_runtime", "plain_tap", "reset_executions_low_water",
]

# A batch taken from a queue holds at most this many packets and bytes (but
# at least one packet): small batches keep the objects alive at once, and so
# the work of Python's garbage collector, small.
BATCH_PACKETS = 256
BATCH_BYTES = 512 << 10
# The smallest batch buffer: buffers follow the batch sizes, so that arrays a
# host function keeps do not keep much unused memory alive.
MIN_BUFFER_BYTES = 16 << 10


class _Device:
  """Receiver-side state of one device queue; used by its consumer thread."""

  __slots__ = ("device_id", "batches", "finished", "finished_bytes",
               "_buffer_bytes", "_buffers", "_index", "_index_address")

  def __init__(self, device_id: int) -> None:
    self.device_id = device_id
    # [packets not yet finished, packets, bytes] of each batch taken.
    self.batches: Deque[List[int]] = collections.deque()
    self.finished = 0        # packets finished and not yet released
    self.finished_bytes = 0
    self._buffer_bytes = MIN_BUFFER_BYTES  # for the next batch
    self._buffers: List[BatchBuffer] = []
    # take's index rows (packet.h:IndexEntry).
    self._index = np.empty((BATCH_PACKETS, native.INDEX_COLUMNS), np.int64)
    self._index_address = self._index.ctypes.data

  def _buffer(self, nbytes: int) -> BatchBuffer:
    """A free buffer of `nbytes` at least: one of the last two, or new."""
    for buffer in self._buffers:
      if buffer.nbytes >= nbytes and buffer.is_free():
        return buffer
    buffer = BatchBuffer(nbytes)
    self._buffers = [buffer, *self._buffers[:1]]
    return buffer

  def take(self, timeout: float) -> Tuple[np.ndarray, np.ndarray]:
    """The next batch's bytes and index rows; releases the finished packets."""
    buffer = self._buffer(self._buffer_bytes)
    while True:
      count, needed = native.take(
          self.device_id, timeout, buffer.address, buffer.nbytes,
          self._index_address, BATCH_PACKETS, self.finished,
          self.finished_bytes)
      self.finished = self.finished_bytes = 0
      if not needed:
        break
      buffer = self._buffer(needed)  # a packet larger than the buffer
    index = self._index[:count]
    if not count:
      return np.empty(0, np.uint8), index
    nbytes = int(index[:, 3].sum())
    self.batches.append([count, count, nbytes])
    copied = int(index[index[:, 4] == 0, 3].sum())  # not lent in blocks
    if not copied:
      return np.empty(0, np.uint8), index
    self._buffer_bytes = min(BATCH_BYTES, max(MIN_BUFFER_BYTES, 2 * copied))
    return buffer.lend(), index

  def finish(self, count: int) -> None:
    """Marks `count` packets of the last batches not yet finished as
    finished.

    Packets finish in the order they were taken, except that a batch taken
    by a nested consumer (`set_nested_consumer`) finishes inside the batch
    before it: the last unfinished batch is always the one being consumed.
    """
    while count:
      batch = self.batches[-1]
      finishing = min(count, batch[0])
      batch[0] -= finishing
      count -= finishing
      if not batch[0]:
        self.batches.pop()
        self.finished += batch[1]
        self.finished_bytes += batch[2]

  def release(self) -> None:
    """Releases the finished packets now (their consumer thread ends)."""
    if self.finished:
      native.release(self.device_id, self.finished, self.finished_bytes)
      self.finished = self.finished_bytes = 0

  def take_as_guest(self) -> Tuple[np.ndarray, np.ndarray]:
    """The next waiting packet's bytes and index rows (none or one), taken
    by a guest (`NativeTransport.take_here`), which the extension's
    `end_guest` finishes: none of `take`'s accounting."""
    buffer = self._buffer(MIN_BUFFER_BYTES)
    while True:
      count, needed = native.take_as_guest(
          self.device_id, buffer.address, buffer.nbytes, self._index_address)
      if not needed:
        break
      buffer = self._buffer(needed)
    index = self._index[:count].copy()
    copied = not index[:, 4].all()  # not lent in a block
    return (buffer.lend() if copied else np.empty(0, np.uint8)), index


class _DroppedByGuest:
  """What `decode` tells of a guest's packet that it drops: nothing needs
  counting, since `end_guest` finishes all that the guest took."""

  __slots__ = ("device_id",)

  def __init__(self, device_id: int) -> None:
    self.device_id = device_id

  def finish(self, count: int) -> None:
    pass


class NativeTransport:
  """The `Transport` over the native queues, one per process.

  The device side (the FFI handlers) needs no Python but for direct runs;
  this object serves the receiver's threads. `_lock` guards `_devices` and
  `_listener`.
  """

  name = "native"
  sites = native_sites.sites  # the module's: one per process

  def __init__(self) -> None:
    assert native is not None, "the native transport is not built"
    self._lock = threading.Lock()
    self._devices: Dict[int, _Device] = {}
    self._listener: Optional[Callable[[int], None]] = None
    self._max_bytes = 0
    # Each thread's buffers for taking as a guest (take_here), by device.
    self._guests = threading.local()
    # A device that waits on Python's main thread checks for Ctrl-C.
    native.set_interrupt_thread(threading.main_thread().ident or 0)

  # --- Producer: what the lowering uses ---

  def open_device(self, device_id: int) -> None:
    """Prepares the device's queue, and its consumer thread if a receiver
    runs, before the device sends."""
    native.open_device(device_id)
    with self._lock:
      if device_id in self._devices:
        return
      self._devices[device_id] = _Device(device_id)
      listener = self._listener
    if listener is not None:
      listener(device_id)

  def register_site(self, consumer_id: int, dtypes: Sequence[np.dtype],
                    shapes: Sequence[Tuple[int, ...]], *, name: str = "",
                    copy: bool = True, packed_results: bool = False,
                    buffers: bool = False,
                    int_columns: Sequence[int] = ()) -> int:
    return native_sites.register_site(consumer_id, dtypes, shapes, name=name,
                                     copy=copy, packed_results=packed_results,
                                     buffers=buffers, int_columns=int_columns)

  def unregister_sites_of(self, consumer_ids: Sequence[int]) -> None:
    """Frees their sites' layouts, here and in the module."""
    self.sites.unregister_consumers(consumer_ids)

  # --- Receiver lifecycle ---

  def set_restart_hook(self, restart: Callable[[], None]) -> None:
    native.set_restart_hook(restart)

  def clear_restart_hook(self) -> None:
    native.set_restart_hook(None)
    native.set_direct_runner(None, None, None)
    native.set_nested_consumer(None)
    native.set_interrupt_thread(0)

  def set_direct_runner(self, runner: DirectRunParts) -> None:
    native.set_direct_runner(runner.run, native_wire.wire_array,
                             device_buffers.CudaBuffer, runner.consumers,
                             runner.failed, runner.failed_queued,
                             runner.run_slots)

  def close_direct_runs(self) -> None:
    native.close_direct_runs()

  def set_nested_consumer(self, consume: Callable[[int], None]) -> None:
    native.set_nested_consumer(consume)

  def set_guest_consumer(self, consume: Callable[[int], None]) -> None:
    """Not needed: the native runner runs the taps that wait before a
    request itself (`native/python_runner.h:RunWaitingTaps`)."""

  def attach(self, max_bytes: int, listener: Callable[[int], None]) -> None:
    self._max_bytes = max_bytes
    with self._lock:
      self._listener = listener
      device_ids = list(self._devices)
    native.attach(max_bytes)
    for device_id in device_ids:
      listener(device_id)

  def detach(self) -> bool:
    with self._lock:
      self._listener = None
    return native.detach()

  def wake_all(self) -> None:
    native.wake_consumers()

  # --- Consumer: what the receiver's threads use ---

  def take_batch(self, device_id: int, timeout: float) -> List[Packet]:
    device = self._devices[device_id]
    data, index = device.take(timeout)
    return decode(data, index, device) if len(index) else []

  def mark_finished(self, device_id: int, packet: Packet) -> None:
    # The bytes are released by the next take_batch, which the consumer
    # thread calls as soon as it has finished its batch, or by release.
    self._devices[device_id].finish(1)

  def mark_count_finished(self, device_id: int, count: int) -> None:
    self._devices[device_id].finish(count)

  def release(self, device_id: int) -> None:
    self._devices[device_id].release()

  def wait_finished(self, device_id: int, is_stopped: Callable[[], bool]) -> None:
    target = native.stats(device_id)[3]
    while (not native.wait_finished(device_id, target, POLL_SECONDS)
           and not is_stopped()):
      pass

  def take_here(self, device_id: int) -> List[Packet]:
    if device_id not in self._devices:
      return []
    try:
      data, index = self._guest(device_id).take_as_guest()
      packets = (decode(data, index, _DroppedByGuest(device_id))
                 if len(index) else [])
    except BaseException:
      native.end_guest(device_id)
      raise
    if not packets:  # nothing taken, or dropped
      native.end_guest(device_id)
    return packets

  def finish_here(self, device_id: int) -> None:
    native.end_guest(device_id)

  def _guest(self, device_id: int) -> _Device:
    """The calling thread's buffers for taking as a guest from a queue."""
    guests = self._guests.__dict__.setdefault("by_device", {})
    guest = guests.get(device_id)
    if guest is None:
      guest = guests[device_id] = _Device(device_id)
    return guest

  def packets_sent(self, device_id: int) -> int:
    return native.stats(device_id)[3]

  def packets_waiting(self, device_id: int) -> int:
    return native.stats(device_id)[1]

  def drained(self) -> bool:
    return native.drained()

  def device_ids(self) -> List[int]:
    with self._lock:
      return list(self._devices)

  def stats(self, device_id: int) -> QueueStats:
    bytes_waiting, packets_waiting, high_water, _ = native.stats(device_id)
    return QueueStats(bytes_waiting, packets_waiting, high_water,
                      self._max_bytes)
