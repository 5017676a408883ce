"""The native transport: C++ XLA FFI handlers put packets on per-device queues.

The device runs `HcbOutfeed` (taps) and `HcbCall` (calls) from the library
built from `receiver/native/`; they copy the arrays into a packet on the
device's queue and go on (a call then waits for its reply) without touching
Python. This module loads the library with ctypes (which releases the GIL
around each native call), and implements the `Transport` protocol for the
receiver's threads: they take packets in batches, decode them into NumPy
views, and post the replies of calls back to the waiting device.

A packet carries a site id instead of shapes: `register_site` records, at
lowering time, the consumer and the array layout of each callback site.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import importlib.machinery
import itertools
import os
import struct
import sys
import threading
from typing import (Any, Callable, Deque, Dict, List, Optional, Sequence,
                    Tuple)

import numpy as np

from .packets import POLL_SECONDS, DirectRunError, Packet, error_message
from .transport import QueueStats

ABI_VERSION = 4
# Names of the FFI targets, as registered with XLA by the JAX side.
OUTFEED_TARGET = "host_callback_outfeed"
CALL_TARGET = "host_callback_call"
TAP_SYNC_TARGET = "host_callback_tap_sync"
# A batch taken from a queue holds at most this many packets and bytes (but
# at least one packet): small batches keep the objects alive at once, and so
# the work of Python's garbage collector, small.
BATCH_PACKETS = 256
BATCH_BYTES = 512 << 10
# The smallest batch buffer: buffers follow the batch sizes, so that arrays a
# host function keeps do not keep much unused memory alive.
MIN_BUFFER_BYTES = 16 << 10

_HEADER_BYTES = 64
_ALIGN = 16
_i64 = ctypes.c_int64
_p_i64 = ctypes.POINTER(ctypes.c_int64)
# `int hook(void)`: ctypes takes the GIL when a device thread calls it.
_RESTART_HOOK = ctypes.CFUNCTYPE(ctypes.c_int)
_p_void = ctypes.POINTER(ctypes.c_void_p)
# Hub's DirectRunner (see hub.h): device id, site, argument pointers, sizes
# and count, result pointers, sizes and count, error buffer and its size.
_DIRECT_RUNNER = ctypes.CFUNCTYPE(
    ctypes.c_int, _i64, _i64, _p_void, _p_i64, _i64, _p_void, _p_i64, _i64,
    ctypes.c_void_p, _i64)
# What a direct runner returns (see hub.h).
_DIRECT_DONE, _DIRECT_FAILED, _DIRECT_DECLINED = 0, 1, 2


def _align(n: int) -> int:
  return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _library_path() -> Optional[str]:
  here = os.path.dirname(os.path.abspath(__file__))
  for suffix in importlib.machinery.EXTENSION_SUFFIXES:
    path = os.path.join(here, "_native" + suffix)
    if os.path.exists(path):
      return path
  return None


def _load() -> Optional[ctypes.CDLL]:
  path = _library_path()
  if path is None:
    return None
  lib = ctypes.CDLL(path)
  signatures = {
      "hcb_abi_version": ([], _i64),
      "hcb_attach": ([_i64], None),
      "hcb_detach": ([], ctypes.c_int),
      "hcb_set_restart_hook": ([_RESTART_HOOK], None),
      "hcb_wake_consumers": ([], None),
      "hcb_set_direct_runner": ([_DIRECT_RUNNER], None),
      "hcb_release": ([_i64, _i64, _i64], None),
      "hcb_open_device": ([_i64], None),
      "hcb_take": ([_i64, ctypes.c_double, ctypes.c_void_p, _i64,
                    ctypes.c_void_p, _i64, _i64, _i64, _p_i64], _i64),
      "hcb_wait_finished": ([_i64, _i64, ctypes.c_double], ctypes.c_int),
      "hcb_stats": ([_i64, _p_i64], None),
      "hcb_reply": ([_i64, _i64, ctypes.c_char_p, ctypes.c_char_p],
                    ctypes.c_int),
      "hcb_reply_error": ([_i64, ctypes.c_char_p], ctypes.c_int),
  }
  for name, (argtypes, restype) in signatures.items():
    function = getattr(lib, name)
    function.argtypes = argtypes
    function.restype = restype
  if lib.hcb_abi_version() != ABI_VERSION:
    raise ImportError(
        f"host_callback: the native library {path} is stale (ABI "
        f"{lib.hcb_abi_version()}, expected {ABI_VERSION}); reinstall "
        "host-callback to rebuild it")
  return lib


_lib = _load()


def available() -> bool:
  """Whether the native library was built and loads."""
  return _lib is not None


def ffi_handlers() -> Dict[str, ctypes._CFuncPtr]:
  """The FFI handlers by target name, as ctypes function pointers.

  The JAX side wraps each with `jax.ffi.pycapsule` and registers it for CPU.
  """
  assert _lib is not None, "the native transport is not built"
  return {OUTFEED_TARGET: _lib.HcbOutfeed, CALL_TARGET: _lib.HcbCall,
          TAP_SYNC_TARGET: _lib.HcbTapSync}


# --- Callback sites: what a packet's bytes mean --------------------------

@dataclasses.dataclass(frozen=True)
class _Column:
  """Where one array of a site's packets lies, and what it is."""
  offset: int
  dtype: np.dtype
  shape: Tuple[int, ...]
  strides: Tuple[int, ...]
  nbytes: int


@dataclasses.dataclass(frozen=True)
class _Site:
  consumer_id: int
  columns: Tuple[_Column, ...]
  packet_bytes: int


_sites_lock = threading.Lock()  # guards the two tables below
_sites: List[_Site] = []
_site_ids: Dict[tuple, int] = {}


def register_site(consumer_id: int, dtypes: Sequence[np.dtype],
                  shapes: Sequence[Tuple[int, ...]]) -> int:
  """The id to put in the packets of a callback site.

  The site's packets carry arrays of these dtypes and shapes, for the
  consumer `consumer_id`.
  """
  key = (consumer_id, tuple(np.dtype(d) for d in dtypes),
         tuple(tuple(s) for s in shapes))
  with _sites_lock:
    site_id = _site_ids.get(key)
    if site_id is not None:
      return site_id
    columns, offset = [], _HEADER_BYTES
    for dtype, shape in zip(key[1], key[2]):
      strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
                      for i in range(len(shape)))
      nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
      columns.append(_Column(offset, dtype, shape, strides, nbytes))
      offset += _align(nbytes)
    site_id = _site_ids[key] = len(_sites)
    _sites.append(_Site(consumer_id, tuple(columns), offset))
    return site_id


# --- The transport ------------------------------------------------------

class _Reply:
  """The reply to one call packet: delivered straight to the waiting device."""

  __slots__ = ("_request_id",)

  def __init__(self, request_id: int) -> None:
    self._request_id = request_id

  def set_result(self, arrays: Sequence[np.ndarray]) -> None:
    """Copies the result arrays into the device's output buffers."""
    assert _lib is not None
    # Bytes objects are the cheapest to hand to ctypes.
    blobs = [np.asarray(a).tobytes() for a in arrays]
    sizes = struct.pack(f"{len(blobs)}q", *map(len, blobs))
    _lib.hcb_reply(self._request_id, len(blobs), sizes, b"".join(blobs))

  def set_error(self, error: BaseException, context: str = "") -> None:
    """Makes the waiting device computation fail with `error`'s message."""
    assert _lib is not None
    message = error_message(error, context)
    _lib.hcb_reply_error(self._request_id,
                         message.encode("utf-8", "backslashreplace"))


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
    self._buffers: List[Tuple[np.ndarray, int]] = []
    self._index = np.empty((BATCH_PACKETS, 4), np.int64)
    self._index_address = self._index.ctypes.data

  def _buffer(self, nbytes: int) -> Tuple[np.ndarray, int]:
    """A buffer of `nbytes` at least, and its address.

    One of the last two is reused when no array views it any more.
    """
    for buffer, address in self._buffers:
      # Referenced by the list's tuple, `buffer` and getrefcount's argument.
      if buffer.nbytes >= nbytes and sys.getrefcount(buffer) == 3:
        return buffer, address
    buffer = np.empty(nbytes, np.uint8)
    entry = (buffer, buffer.ctypes.data)
    self._buffers = [entry, *self._buffers[:1]]
    return entry

  def take(self, timeout: float) -> Tuple[np.ndarray, np.ndarray]:
    """The next batch's bytes and index rows; releases the finished packets."""
    assert _lib is not None
    needed = _i64(0)
    data, address = self._buffer(self._buffer_bytes)
    while True:
      count = _lib.hcb_take(self.device_id, timeout, address, data.nbytes,
                            self._index_address, BATCH_PACKETS, self.finished,
                            self.finished_bytes, ctypes.byref(needed))
      self.finished = self.finished_bytes = 0
      if not needed.value:
        break
      data, address = self._buffer(needed.value)  # one large packet
    index = self._index[:count]
    if count:
      nbytes = int(index[:, 3].sum())
      self.batches.append([count, count, nbytes])
      self._buffer_bytes = min(BATCH_BYTES, max(MIN_BUFFER_BYTES, 2 * nbytes))
    return data, index

  def release(self) -> None:
    """Releases the finished packets now (their consumer thread ends)."""
    assert _lib is not None
    if self.finished:
      _lib.hcb_release(self.device_id, self.finished, self.finished_bytes)
      self.finished = self.finished_bytes = 0


class NativeTransport:
  """The `Transport` over the native queues, one per process.

  The device side (the FFI handlers) needs no Python; this object serves
  the receiver's threads. `_lock` guards `_devices` and `_listener`.
  """

  name = "native"

  def __init__(self) -> None:
    assert _lib is not None, "the native transport is not built"
    self._lock = threading.Lock()
    self._devices: Dict[int, _Device] = {}
    self._listener: Optional[Callable[[int], None]] = None
    self._max_bytes = 0
    self._restart_hook: Optional[ctypes._CFuncPtr] = None  # kept alive
    self._direct_runner: Optional[ctypes._CFuncPtr] = None  # kept alive

  # --- Producer: what the lowering uses ---

  def open_device(self, device_id: int) -> None:
    """Prepares the device's queue, and its consumer thread if a receiver
    runs, before the device sends."""
    assert _lib is not None
    _lib.hcb_open_device(device_id)
    with self._lock:
      if device_id in self._devices:
        return
      self._devices[device_id] = _Device(device_id)
      listener = self._listener
    if listener is not None:
      listener(device_id)

  def register_site(self, consumer_id: int, dtypes: Sequence[np.dtype],
                    shapes: Sequence[Tuple[int, ...]]) -> int:
    return register_site(consumer_id, dtypes, shapes)

  # --- Receiver lifecycle ---

  def set_restart_hook(self, restart: Callable[[], None]) -> None:
    assert _lib is not None

    def hook() -> int:
      try:
        restart()
        return 0
      except BaseException:  # pylint: disable=broad-except
        return 1  # the device fails with "cannot start again"

    self._restart_hook = _RESTART_HOOK(hook)
    _lib.hcb_set_restart_hook(self._restart_hook)

  def clear_restart_hook(self) -> None:
    assert _lib is not None
    _lib.hcb_set_restart_hook(_RESTART_HOOK())
    _lib.hcb_set_direct_runner(_DIRECT_RUNNER())

  def set_direct_runner(self, run: DirectRun) -> None:
    """Lets a device whose queue is idle run a request's host function on
    its own thread: `run(consumer_id, device_id, arrays)` returns the results
    or raises `DirectRunError`."""
    assert _lib is not None
    self._direct_runner = _DIRECT_RUNNER(functools.partial(_run_direct, run))
    _lib.hcb_set_direct_runner(self._direct_runner)

  def attach(self, max_bytes: int, listener: Callable[[int], None]) -> None:
    assert _lib is not None
    self._max_bytes = max_bytes
    with self._lock:
      self._listener = listener
      device_ids = list(self._devices)
    _lib.hcb_attach(max_bytes)
    for device_id in device_ids:
      listener(device_id)

  def detach(self) -> bool:
    assert _lib is not None
    with self._lock:
      self._listener = None
    return bool(_lib.hcb_detach())

  def wake_all(self) -> None:
    assert _lib is not None
    _lib.hcb_wake_consumers()

  # --- Consumer: what the receiver's threads use ---

  def take_batch(self, device_id: int, timeout: float) -> List[Packet]:
    device = self._devices[device_id]
    data, index = device.take(timeout)
    return _decode(data, index.tolist(), device_id) if len(index) else []

  def mark_finished(self, device_id: int, packet: Packet) -> None:
    # The bytes are released by the next take_batch, which the consumer
    # thread calls as soon as it has finished its batch, or by release.
    device = self._devices[device_id]
    batch = device.batches[0]
    batch[0] -= 1
    if not batch[0]:
      device.batches.popleft()
      device.finished += batch[1]
      device.finished_bytes += batch[2]

  def release(self, device_id: int) -> None:
    self._devices[device_id].release()

  def wait_finished(self, device_id: int, is_stopped: Callable[[], bool]) -> None:
    assert _lib is not None
    target = self._stats(device_id)[3]
    while (not _lib.hcb_wait_finished(device_id, target, POLL_SECONDS)
           and not is_stopped()):
      pass

  def packets_sent(self, device_id: int) -> int:
    return self._stats(device_id)[3]

  def device_ids(self) -> List[int]:
    with self._lock:
      return list(self._devices)

  def _stats(self, device_id: int) -> List[int]:
    assert _lib is not None
    out = (ctypes.c_int64 * 4)()
    _lib.hcb_stats(device_id, out)
    return list(out)

  def stats(self, device_id: int) -> QueueStats:
    bytes_waiting, packets_waiting, high_water, _ = self._stats(device_id)
    return QueueStats(bytes_waiting, packets_waiting, high_water,
                      self._max_bytes)


DirectRun = Callable[[int, int, List[np.ndarray]], Optional[Sequence[np.ndarray]]]


def _run_direct(run: DirectRun, device_id: int, site_id: int, args: Any,
                arg_bytes: Any, num_args: int, results: Any, result_bytes: Any,
                num_results: int, error: int, error_capacity: int) -> int:
  """Hub's DirectRunner: copies the arguments into arrays the host function
  owns, runs it, and writes its results into the device's buffers."""
  try:
    site = _sites[site_id]
    arrays = []
    for i, column in enumerate(site.columns):
      if arg_bytes[i] != column.nbytes:
        return _DIRECT_DECLINED  # a layout this decoder does not know
      # A writable copy that the host function owns.
      data = bytearray(ctypes.string_at(args[i], column.nbytes))
      arrays.append(np.frombuffer(data, column.dtype).reshape(column.shape))
    try:
      outputs = run(site.consumer_id, device_id, arrays) or ()
    except DirectRunError as failure:
      message = str(failure).encode("utf-8", "backslashreplace")
      ctypes.memmove(error, message, min(len(message), error_capacity))
      return _DIRECT_FAILED
    if len(outputs) != num_results:
      return _DIRECT_DECLINED
    for i, output in enumerate(outputs):
      output = np.ascontiguousarray(output)
      if output.nbytes != result_bytes[i]:
        return _DIRECT_DECLINED  # the receiver thread reports the mismatch
      if output.nbytes:
        ctypes.memmove(results[i], output.ctypes.data, output.nbytes)
    return _DIRECT_DONE
  except BaseException:  # pylint: disable=broad-except
    return _DIRECT_DECLINED


def _decode(data: np.ndarray, rows: List[List[int]], device_id: int
            ) -> List[Packet]:
  """The packets of a batch, their arrays views over `data`.

  `rows` has a row (offset, site, request id, size) per packet. Consecutive
  packets of one site lie at a fixed stride, so each of the site's arrays is
  one strided view whose rows are the packets' arrays.
  """
  packets: List[Packet] = []
  start, count = 0, len(rows)
  while start < count:
    offset, site_id, request_id, _ = rows[start]
    stop = start + 1
    while stop < count and rows[stop][1] == site_id:
      stop += 1
    site = _sites[site_id]
    run = stop - start
    start = stop
    if run == 1:  # the usual batch of a `call`: skip the strided views
      packets.append(Packet(
          site.consumer_id, device_id,
          [np.ndarray(c.shape, c.dtype, data, offset + c.offset)
           for c in site.columns],
          _Reply(request_id) if request_id else None))
      continue
    columns = []
    for column in site.columns:
      view = np.ndarray((run,) + column.shape, column.dtype, data,
                        offset + column.offset,
                        (site.packet_bytes,) + column.strides)
      # A row of a 1-d view would be a NumPy scalar: keep 0-d arrays.
      columns.append(list(view) if column.shape
                     else [view[i, ...] for i in range(run)])
    arrays = zip(*columns) if columns else itertools.repeat((), run)
    replies = (map(_Reply, [row[2] for row in rows[stop - run:stop]])
               if request_id else itertools.repeat(None, run))
    packets.extend(map(Packet, itertools.repeat(site.consumer_id, run),
                       itertools.repeat(device_id, run), arrays, replies))
  return packets
