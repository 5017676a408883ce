"""The native transport: C++ XLA FFI handlers put packets on per-device queues.

The device runs `HcbOutfeed` (taps) and `HcbCall` (calls) from the library
built from `receiver/native/`; they copy the arrays into a packet on the
device's queue and go on (a call then waits for its reply) without touching
Python. This module loads the library with ctypes (which releases the GIL
around each native call), and implements the `Transport` protocol for the
receiver's threads: they take packets in batches, decode them into NumPy
views, and post the replies of calls back to the waiting device.

A packet carries a site id instead of shapes: `register_site` records, at
lowering time, the consumer and the array layout of each callback site, here
and (as byte sizes, which the device's arrays must have) in the library.

Memory: a packet of at least `LARGE_PACKET_BYTES` lies in a block of its own,
written once by the device; the host function's arrays are views of it, and
a `_Lease` gives the block back to the library's pool once no array views
it. Smaller packets are copied in batches into a buffer lent to the batch
(`_Buffer`). Either way a packet's memory is its own: its arrays are
writable, and a host function may keep them. A call's results are written
straight into the device's output buffers, once.

This module owns the wire format. An array takes its XLA size: sub-byte
dtypes (int4, uint4, int2, uint2, float4_e2m1fn) are packed, several elements
to a byte with the first in the lowest bits; host functions get them one
element per byte, as NumPy (ml_dtypes) stores them, and a call's results are
packed again for the device.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import importlib.machinery
import itertools
import logging
import os
import struct
import threading
import weakref
from typing import (Any, Callable, Deque, Dict, List, Optional, Sequence,
                    Tuple)

import numpy as np

from .packets import POLL_SECONDS, DirectRunError, Packet, error_message
from .transport import QueueStats

ABI_VERSION = 7
# Names of the FFI targets, as registered with XLA by the JAX side.
OUTFEED_TARGET = "host_callback_outfeed"
CALL_TARGET = "host_callback_call"
TAP_SYNC_TARGET = "host_callback_tap_sync"
BEGIN_TARGET = "host_callback_begin"
END_TARGET = "host_callback_end"
# A batch taken from a queue holds at most this many packets and bytes (but
# at least one packet): small batches keep the objects alive at once, and so
# the work of Python's garbage collector, small.
BATCH_PACKETS = 256
BATCH_BYTES = 512 << 10
# The smallest batch buffer: buffers follow the batch sizes, so that arrays a
# host function keeps do not keep much unused memory alive.
MIN_BUFFER_BYTES = 16 << 10

# Packets this large are lent in blocks instead of copied (kLargePacket).
LARGE_PACKET_BYTES = 256 << 10

_HEADER_BYTES = 64
_ALIGN = 16
_INDEX_COLUMNS = 6  # hcb_take's index rows, see hub.h:IndexEntry
_i64 = ctypes.c_int64
_p_i64 = ctypes.POINTER(ctypes.c_int64)
# `int hook(void)`: ctypes takes the GIL when a device thread calls it.
_RESTART_HOOK = ctypes.CFUNCTYPE(ctypes.c_int)
_INTERRUPT_HOOK = ctypes.CFUNCTYPE(ctypes.c_int)
_p_void = ctypes.POINTER(ctypes.c_void_p)
# Hub's DirectRunner (see hub.h): device id, site, block and packet address
# (0 for a small request), argument pointers, sizes and count, result
# pointers, sizes and count, error buffer and its size.
_DIRECT_RUNNER = ctypes.CFUNCTYPE(
    ctypes.c_int, _i64, _i64, _i64, ctypes.c_void_p, _p_void, _p_i64, _i64,
    _p_void, _p_i64, _i64, ctypes.c_void_p, _i64)
# What a direct runner returns (see hub.h).
_DIRECT_DONE, _DIRECT_FAILED, _DIRECT_DECLINED, _DIRECT_INTERRUPTED = 0, 1, 2, 3
# hcb_reply's code when the results' sizes are not the device's.
_REPLY_SIZE_MISMATCH = 2


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
      "hcb_executions": ([_p_i64], None),
      "hcb_reset_executions_low_water": ([], None),
      "hcb_execution_failed": ([], None),
      "hcb_attach": ([_i64], None),
      "hcb_detach": ([], ctypes.c_int),
      "hcb_set_restart_hook": ([_RESTART_HOOK], None),
      "hcb_wake_consumers": ([], None),
      "hcb_set_direct_runner": ([_DIRECT_RUNNER], None),
      "hcb_set_interrupt_hook": ([_INTERRUPT_HOOK, ctypes.c_void_p,
                                  ctypes.c_uint64], None),
      "hcb_register_site": ([_i64, _i64, ctypes.c_char_p], _i64),
      "hcb_unregister_site": ([_i64], _i64),
      "hcb_release": ([_i64, _i64, _i64], _i64),
      "hcb_open_device": ([_i64], _i64),
      "hcb_take": ([_i64, ctypes.c_double, ctypes.c_void_p, _i64,
                    ctypes.c_void_p, _i64, _i64, _i64, _p_i64], _i64),
      "hcb_wait_finished": ([_i64, _i64, ctypes.c_double], _i64),
      "hcb_stats": ([_i64, _p_i64], _i64),
      "hcb_return_block": ([_i64], None),
      "hcb_pool_stats": ([_p_i64], _i64),
      "hcb_reply": ([_i64, _i64, ctypes.c_char_p, ctypes.c_void_p], _i64),
      "hcb_reply_error": ([_i64, ctypes.c_char_p], _i64),
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
_logger = logging.getLogger("host_callback")


def _checked(code: int) -> int:
  """`code`, returned by a library function; raises for its error codes."""
  if code == -1:
    raise MemoryError("host_callback: the native library ran out of memory")
  if code < 0:
    raise RuntimeError("host_callback: the native library failed "
                       f"(error code {code})")
  return code


def available() -> bool:
  """Whether the native library was built and loads."""
  return _lib is not None


def ffi_handlers() -> Dict[str, ctypes._CFuncPtr]:
  """The FFI handlers by target name, as ctypes function pointers.

  The JAX side wraps each with `jax.ffi.pycapsule` and registers it for CPU.
  """
  assert _lib is not None, "the native transport is not built"
  return {OUTFEED_TARGET: _lib.HcbOutfeed, CALL_TARGET: _lib.HcbCall,
          TAP_SYNC_TARGET: _lib.HcbTapSync, BEGIN_TARGET: _lib.HcbBegin,
          END_TARGET: _lib.HcbEnd}


# --- Executions in flight (see native/executions.h) ----------------------

def executions() -> Tuple[int, int, int]:
  """Executions of our computations begun ever, in flight now, and the
  fewest in flight right after one ended since the last
  `reset_executions_low_water` (a huge number when none ended)."""
  assert _lib is not None, "the native transport is not built"
  out = (ctypes.c_int64 * 3)()
  _lib.hcb_executions(out)
  return out[0], out[1], out[2]


def reset_executions_low_water() -> None:
  assert _lib is not None, "the native transport is not built"
  _lib.hcb_reset_executions_low_water()


def execution_failed() -> None:
  """An execution stopped at one of our Python callbacks, which raised."""
  assert _lib is not None, "the native transport is not built"
  _lib.hcb_execution_failed()


# --- Callback sites: what a packet's bytes mean --------------------------

def _packed_bits(dtype: np.dtype) -> Optional[int]:
  """The bits per element of a dtype XLA packs below a byte, else None."""
  if dtype.itemsize != 1 or dtype.type.__module__ != "ml_dtypes":
    return None
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  try:
    bits = ml_dtypes.iinfo(dtype).bits
  except ValueError:
    bits = ml_dtypes.finfo(dtype).bits
  return bits if bits in (1, 2, 4) else None


def _unpack(packed: np.ndarray, dtype: np.dtype, shape: Tuple[int, ...],
            bits: int) -> np.ndarray:
  """A new array of `shape` from XLA's packed bytes, one element per byte."""
  shifts = np.arange(0, 8, bits, dtype=np.uint8)
  codes = (packed.reshape(-1, 1) >> shifts) & np.uint8((1 << bits) - 1)
  size = int(np.prod(shape, dtype=np.int64))
  return codes.reshape(-1)[:size].view(dtype).reshape(shape)


def _pack(array: np.ndarray, bits: int) -> np.ndarray:
  """XLA's packed bytes of `array` (a sub-byte dtype, one element per byte)."""
  per_byte = 8 // bits
  codes = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
  codes = np.pad(codes & np.uint8((1 << bits) - 1),
                 (0, -codes.size % per_byte)).reshape(-1, per_byte)
  shifts = np.arange(0, 8, bits, dtype=np.uint8)
  return np.bitwise_or.reduce(codes << shifts, axis=1).astype(np.uint8)


def _wire_array(array: Any) -> np.ndarray:
  """A result as the device stores it, C-contiguous: the array itself when
  it already is (so that it is copied once, into the device's buffer), else
  a packed or contiguous copy."""
  array = np.asarray(array)
  bits = _packed_bits(array.dtype)
  if bits is not None:
    return _pack(array, bits)
  return array if array.flags.c_contiguous else np.ascontiguousarray(array)


class _Lease:
  """Owns a block that the library lent (a large packet's memory); gives it
  back to the pool when garbage, that is once no array views it."""

  __slots__ = ("_block",)

  def __init__(self, block: int) -> None:
    self._block = block

  def __del__(self) -> None:
    if _lib is not None:  # None late in interpreter shutdown
      _lib.hcb_return_block(self._block)


def _lent(block: int, address: int, nbytes: int) -> np.ndarray:
  """A lent block's first `nbytes` as a uint8 array: arrays made from it
  keep, through their bases, the ctypes array that holds the block's lease."""
  lease = _Lease(block)  # first: whatever fails below, the block goes back
  memory = (ctypes.c_uint8 * nbytes).from_address(address)
  memory.lease = lease
  return np.frombuffer(memory, np.uint8)


def pool_stats() -> Dict[str, int]:
  """The native block pool: free bytes and blocks, blocks out of the pool
  (queued or viewed by arrays) and bytes mapped in all."""
  assert _lib is not None
  out = (ctypes.c_int64 * 4)()
  _checked(_lib.hcb_pool_stats(out))
  return dict(zip(("free_bytes", "free_blocks", "blocks_out",
                   "mapped_bytes"), out))


@dataclasses.dataclass(frozen=True)
class _Column:
  """Where one array of a site's packets lies, and what it is.

  `packed_bits` is set for a sub-byte dtype, whose `nbytes` are packed.
  """
  offset: int
  dtype: np.dtype
  shape: Tuple[int, ...]
  strides: Tuple[int, ...]
  nbytes: int
  packed_bits: Optional[int]

  def array(self, data: np.ndarray, offset: int) -> np.ndarray:
    """The column's array in the packet at `offset` of `data`: a view, or a
    new unpacked array for a sub-byte dtype."""
    if self.packed_bits is None:
      return np.ndarray(self.shape, self.dtype, data, offset + self.offset)
    start = offset + self.offset
    return _unpack(data[start:start + self.nbytes], self.dtype, self.shape,
                   self.packed_bits)

  def copy_from(self, address: int) -> np.ndarray:
    """A new array, which its receiver owns, from the column's bytes at
    `address`."""
    data = np.empty(self.nbytes, np.uint8)
    if self.nbytes:
      ctypes.memmove(data.ctypes.data, address, self.nbytes)
    if self.packed_bits is None:
      return data.view(self.dtype).reshape(self.shape)
    return _unpack(data, self.dtype, self.shape, self.packed_bits)


def _column(offset: int, dtype: np.dtype, shape: Tuple[int, ...]) -> _Column:
  size = int(np.prod(shape, dtype=np.int64))
  strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
                  for i in range(len(shape)))
  bits = _packed_bits(dtype)
  nbytes = dtype.itemsize * size if bits is None else -(-size * bits // 8)
  return _Column(offset, dtype, shape, strides, nbytes, bits)


@dataclasses.dataclass(frozen=True)
class _Site:
  consumer_id: int
  columns: Tuple[_Column, ...]
  packet_bytes: int


_sites_lock = threading.Lock()  # guards the three tables below
_sites: Dict[int, _Site] = {}
_site_ids: Dict[tuple, int] = {}
_next_site_id = itertools.count()


def register_site(consumer_id: int, dtypes: Sequence[np.dtype],
                  shapes: Sequence[Tuple[int, ...]]) -> int:
  """The id to put in the packets of a callback site.

  The site's packets carry arrays of these dtypes and shapes, for the
  consumer `consumer_id`. Ids are never reused.
  """
  assert _lib is not None, "the native transport is not built"
  key = (consumer_id, tuple(np.dtype(d) for d in dtypes),
         tuple(tuple(s) for s in shapes))
  with _sites_lock:
    site_id = _site_ids.get(key)
    if site_id is not None:
      return site_id
    columns, offset = [], _HEADER_BYTES
    for dtype, shape in zip(key[1], key[2]):
      columns.append(_column(offset, dtype, shape))
      offset += _align(columns[-1].nbytes)
    site_id = next(_next_site_id)
    sizes = [c.nbytes for c in columns]
    _checked(_lib.hcb_register_site(
        site_id, len(sizes), struct.pack(f"{len(sizes)}q", *sizes)))
    _site_ids[key] = site_id
    _sites[site_id] = _Site(consumer_id, tuple(columns), offset)
    return site_id


def unregister_site(site_id: int) -> None:
  """Frees a site; a device that sends to it from now on fails, and its
  packets still queued are dropped with an error."""
  assert _lib is not None
  with _sites_lock:
    site = _sites.pop(site_id, None)
    if site is None:
      return
    key = (site.consumer_id, tuple(c.dtype for c in site.columns),
           tuple(c.shape for c in site.columns))
    del _site_ids[key]
    _checked(_lib.hcb_unregister_site(site_id))


# --- The transport ------------------------------------------------------

class _Reply:
  """The reply to one call packet: delivered straight to the waiting device."""

  __slots__ = ("_request_id", "done")

  def __init__(self, request_id: int) -> None:
    self._request_id = request_id
    self.done = False  # answered, with a result or an error

  def set_result(self, arrays: Sequence[np.ndarray]) -> None:
    """Copies the result arrays into the device's output buffers.

    When their sizes do not match the device's buffers, the device fails
    and this raises ValueError, which the receiver records like any other
    host function error.
    """
    assert _lib is not None
    wires = [_wire_array(a) for a in arrays]  # alive until hcb_reply returns
    sizes = struct.pack(f"{len(wires)}q", *(w.nbytes for w in wires))
    data = (ctypes.c_void_p * len(wires))(*(w.ctypes.data for w in wires))
    try:
      outcome = _checked(_lib.hcb_reply(self._request_id, len(wires), sizes,
                                        data))
    except (MemoryError, RuntimeError) as error:
      self.set_error(error)
      return
    self.done = True
    if outcome == _REPLY_SIZE_MISMATCH:
      raise ValueError(
          "host_callback: a call's results ("
          + ", ".join(f"{a.dtype}{list(a.shape)}"
                      for a in map(np.asarray, arrays))
          + ") do not have the byte sizes its device expects; the device "
          "fails")

  def set_error(self, error: BaseException, context: str = "") -> None:
    """Makes the waiting device computation fail with `error`'s message."""
    assert _lib is not None
    message = error_message(error, context)
    self.done = True
    _checked(_lib.hcb_reply_error(self._request_id,
                                  message.encode("utf-8", "backslashreplace")))


class _Buffer:
  """Memory that batches are copied into, lent to one batch at a time.

  `lend()` wraps the memory in a new owner (a ctypes array); the arrays
  decoded from that batch are views whose base is the owner, so the memory
  is free for another batch only once the owner and all of them are gone.
  """

  __slots__ = ("_memory", "address", "nbytes", "_owner")

  def __init__(self, nbytes: int) -> None:
    self._memory = np.empty(nbytes, np.uint8)
    self.address = self._memory.ctypes.data
    self.nbytes = nbytes
    self._owner: Callable[[], Any] = lambda: None  # a weak reference

  def is_free(self) -> bool:
    return self._owner() is None

  def lend(self) -> np.ndarray:
    """The memory as a uint8 array whose base is a new owner."""
    owner = (ctypes.c_uint8 * self.nbytes).from_buffer(self._memory)
    self._owner = weakref.ref(owner)
    return np.frombuffer(owner, np.uint8)


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
    self._buffers: List[_Buffer] = []
    self._index = np.empty((BATCH_PACKETS, _INDEX_COLUMNS), np.int64)
    self._index_address = self._index.ctypes.data

  def _buffer(self, nbytes: int) -> _Buffer:
    """A free buffer of `nbytes` at least: one of the last two, or new."""
    for buffer in self._buffers:
      if buffer.nbytes >= nbytes and buffer.is_free():
        return buffer
    buffer = _Buffer(nbytes)
    self._buffers = [buffer, *self._buffers[:1]]
    return buffer

  def take(self, timeout: float) -> Tuple[np.ndarray, np.ndarray]:
    """The next batch's bytes and index rows; releases the finished packets."""
    assert _lib is not None
    needed = _i64(0)
    buffer = self._buffer(self._buffer_bytes)
    while True:
      count = _checked(_lib.hcb_take(
          self.device_id, timeout, buffer.address, buffer.nbytes,
          self._index_address, BATCH_PACKETS, self.finished,
          self.finished_bytes, ctypes.byref(needed)))
      self.finished = self.finished_bytes = 0
      if not needed.value:
        break
      buffer = self._buffer(needed.value)  # a packet larger than the buffer
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

  def drop(self) -> None:
    """Marks one packet of the last batch finished without a consumer."""
    batch = self.batches[-1]
    batch[0] -= 1
    if not batch[0]:
      self.batches.pop()
      self.finished += batch[1]
      self.finished_bytes += batch[2]

  def release(self) -> None:
    """Releases the finished packets now (their consumer thread ends)."""
    assert _lib is not None
    if self.finished:
      _checked(_lib.hcb_release(self.device_id, self.finished,
                                self.finished_bytes))
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
    _lib.hcb_set_interrupt_hook(
        _interrupt_hook,
        ctypes.cast(ctypes.pythonapi.PyErr_SetInterrupt, ctypes.c_void_p),
        threading.main_thread().ident or 0)

  # --- Producer: what the lowering uses ---

  def open_device(self, device_id: int) -> None:
    """Prepares the device's queue, and its consumer thread if a receiver
    runs, before the device sends."""
    assert _lib is not None
    _checked(_lib.hcb_open_device(device_id))
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

  def unregister_site(self, site_id: int) -> None:
    """Frees a site's layout, here and in the library; see `unregister_site`."""
    unregister_site(site_id)

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
    _lib.hcb_set_interrupt_hook(_INTERRUPT_HOOK(), None, 0)

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
    return _decode(data, index.tolist(), device) if len(index) else []

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
    while (not _checked(_lib.hcb_wait_finished(device_id, target,
                                               POLL_SECONDS))
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
    _checked(_lib.hcb_stats(device_id, out))
    return list(out)

  def stats(self, device_id: int) -> QueueStats:
    bytes_waiting, packets_waiting, high_water, _ = self._stats(device_id)
    return QueueStats(bytes_waiting, packets_waiting, high_water,
                      self._max_bytes)


DirectRun = Callable[[int, int, List[np.ndarray]], Optional[Sequence[np.ndarray]]]


def _make_interrupt_hook() -> ctypes._CFuncPtr:
  """Hub's InterruptHook: Python's PyOS_InterruptOccurred, which on the main
  thread reports (and clears) a pending Ctrl-C without running Python code,
  so that no signal handler can raise inside the hook. The library then
  re-arms it with PyErr_SetInterrupt."""
  occurred = ctypes.pythonapi.PyOS_InterruptOccurred
  occurred.argtypes = []
  occurred.restype = ctypes.c_int
  return _INTERRUPT_HOOK(occurred)


_interrupt_hook = _make_interrupt_hook()


def _fail_direct(message: str, error: int, error_capacity: int) -> int:
  """Writes the device's error message; returns the runner's failure code."""
  encoded = message.encode("utf-8", "backslashreplace")
  ctypes.memmove(error, encoded, min(len(encoded), error_capacity))
  return _DIRECT_FAILED


def _run_direct(run: DirectRun, device_id: int, site_id: int, block: int,
                packet: int, args: Any, arg_bytes: Any, num_args: int,
                results: Any, result_bytes: Any, num_results: int, error: int,
                error_capacity: int) -> int:
  """Hub's DirectRunner: runs the host function on arrays it owns, and
  writes its results into the device's buffers.

  A large request's arguments are views of the `block` the library copied
  them into (at `packet`); a small one's are copied here. Declines (the
  request then goes through the queue) only before the host function ran.
  """
  try:
    data = (_lent(block, packet, _HEADER_BYTES + sum(
        _align(arg_bytes[i]) for i in range(num_args))) if block else None)
    site = _sites[site_id]
    if [arg_bytes[i] for i in range(num_args)] != [
        c.nbytes for c in site.columns]:
      return _DIRECT_DECLINED  # the decoder reports it
    arrays = ([c.array(data, 0) for c in site.columns] if data is not None
              else [c.copy_from(args[i]) for i, c in enumerate(site.columns)])
    del data
  except BaseException:  # pylint: disable=broad-except
    return _DIRECT_DECLINED  # the decoder reports it
  try:
    outputs = run(site.consumer_id, device_id, arrays) or ()
    del arrays  # the block goes back unless the host function kept them
    wires = [_wire_array(output) for output in outputs]
    sizes = [wire.nbytes for wire in wires]
    expected = [result_bytes[i] for i in range(num_results)]
    if sizes != expected:
      return _fail_direct(
          f"host_callback: the host's result for a call has arrays of "
          f"{sizes} bytes where the device expects {expected}", error,
          error_capacity)
    for i, wire in enumerate(wires):
      if wire.nbytes:
        ctypes.memmove(results[i], wire.ctypes.data, wire.nbytes)
    return _DIRECT_DONE
  except DirectRunError as failure:
    _fail_direct(str(failure), error, error_capacity)
    # The library re-arms Ctrl-C for the user on an interrupt.
    return (_DIRECT_INTERRUPTED
            if isinstance(failure.__cause__, KeyboardInterrupt)
            else _DIRECT_FAILED)
  except BaseException as failure:  # pylint: disable=broad-except
    return _fail_direct(error_message(failure, "host_callback"), error,
                        error_capacity)


def _drop(device: _Device, row: List[int], site: Optional[_Site]) -> None:
  """Drops a packet that does not match its site: logs why, and fails its
  device if it waits (a call)."""
  site_id, request_id, size = row[1:4]
  if site is None:
    reason = (f"host_callback: device {device.device_id} sent a packet to "
              f"callback site {site_id}, which was unregistered")
  else:
    reason = (f"host_callback: device {device.device_id} sent a packet of "
              f"{size} bytes to callback site {site_id}, which expects "
              f"{site.packet_bytes}")
  _logger.error("%s; it is dropped", reason)
  if request_id:
    _Reply(request_id).set_error(RuntimeError(reason))
  device.drop()


def _decode(data: np.ndarray, rows: List[List[int]], device: _Device
            ) -> List[Packet]:
  """The packets of a batch, their arrays views over `data` or over their
  own blocks.

  `rows` has a row (offset, site, request id, size, block, address) per
  packet. A large packet (with a block) is decoded alone, its arrays views of
  its block. Consecutive small packets of one site lie at a fixed stride in
  `data`, so each of the site's arrays is one strided view whose rows are the
  packets' arrays (sub-byte arrays are unpacked into new arrays instead). A
  packet whose site is unknown or whose size is not its site's is dropped
  (`_drop`).
  """
  packets: List[Packet] = []
  start, count = 0, len(rows)
  device_id = device.device_id
  while start < count:
    offset, site_id, request_id, _, block, address = rows[start]
    stop = start + 1
    if not block:
      while stop < count and rows[stop][1] == site_id and not rows[stop][4]:
        stop += 1
    site = _sites.get(site_id)
    run_rows = rows[start:stop]
    start = stop
    if site is None or any(row[3] != site.packet_bytes for row in run_rows):
      for row in run_rows:
        if row[4]:
          _Lease(row[4])  # gives the block back at once
        _drop(device, row, site)
      continue
    run = len(run_rows)
    if run == 1:  # a large packet, or the usual batch of a `call`
      memory = _lent(block, address, site.packet_bytes) if block else data
      packets.append(Packet(
          site.consumer_id, device_id,
          [c.array(memory, 0 if block else offset) for c in site.columns],
          _Reply(request_id) if request_id else None))
      continue
    columns = []
    for column in site.columns:
      if column.packed_bits is not None:
        columns.append([column.array(data, row[0]) for row in run_rows])
        continue
      view = np.ndarray((run,) + column.shape, column.dtype, data,
                        offset + column.offset,
                        (site.packet_bytes,) + column.strides)
      # A row of a 1-d view would be a NumPy scalar: keep 0-d arrays.
      columns.append(list(view) if column.shape
                     else [view[i, ...] for i in range(run)])
    arrays = zip(*columns) if columns else itertools.repeat((), run)
    replies = (map(_Reply, [row[2] for row in run_rows])
               if request_id else itertools.repeat(None, run))
    packets.extend(map(Packet, itertools.repeat(site.consumer_id, run),
                       itertools.repeat(device_id, run), arrays, replies))
  return packets
