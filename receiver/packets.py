"""Packets that travel from a device to the host, and the replies to them."""

from __future__ import annotations

import dataclasses
import threading
from typing import (Any, Callable, Mapping, NoReturn, Optional, Sequence,
                    Union)

import numpy as np

from .errors import host_function_error, names_its_cause, with_host_traceback

# How often a blocked wait wakes up to re-check its way out (stop flag,
# Ctrl-C), on both transports and in the barrier: the native module's
# kPollInterval (native/waits.h, exported as POLL_SECONDS; a test keeps the
# two equal), written here for the installs without the module.
POLL_SECONDS = 0.05

# What a packet waiting in a Python queue costs beyond its arrays' data,
# counted in the queue's byte bound as the native transport counts its
# 64-byte packet header (kHeaderBytes in native/packet.h) and array alignment.
# Measured as the growth of the resident set per queued packet (CPython 3.11
# and 3.12, NumPy 2): a Packet and its list take 136 bytes, and each NumPy
# array with its own data allocation 176 bytes more than its data. Without
# them a million taps of `()` would count as 0 bytes and take 136 MB.
PACKET_OVERHEAD_BYTES = 136
ARRAY_OVERHEAD_BYTES = 176


class ReceiverStopped(RuntimeError):
  """Raised to a sender that needs a receiver when none can start."""


def error_message(error: BaseException, context: str) -> str:
  """What a device that waited for a host function fails with: a line that
  names the host function (`context`, or an error of ours names it) and
  `error`, then the host function's traceback."""
  if names_its_cause(error):
    line = str(error)
  else:
    message = str(error) if error.args else type(error).__name__
    line = f"{type(error).__name__}: {message}"
  return with_host_traceback(f"{context} raised {line}" if context else line,
                             error)


def device_error(error: BaseException, context: str) -> BaseException:
  """What a device that waited for a host function raises when it raised
  `error`: an error whose message is `error_message`'s, chained to the
  host function's exception. `context` (e.g. which host function raised
  it) prefixes the message; without one, an error of ours keeps its type
  (a call's CallError, which JAX's GPU callbacks raise as it is), and any
  other error (Ctrl-C) is raised as it is."""
  if context:
    raised: BaseException = RuntimeError(error_message(error, context))
    raised.__cause__ = error
    return raised
  if error is host_function_error(error):
    return error
  raised = type(error)(error_message(error, context))  # ours take a message
  raised.__cause__ = error.__cause__
  return raised


class DirectRunError(Exception):
  """A host function run on the device thread raised `cause`; the message
  is what the device fails with. `error`, which the native device thread
  reads, is `cause` when Ctrl-C stopped it (`ctrl_c.stopped_by_ctrl_c`; the
  thread then re-arms Ctrl-C for the main thread), else None."""

  def __init__(self, cause: BaseException, context: str,
               interrupted: bool) -> None:
    super().__init__(error_message(cause, context))
    self.cause = cause
    self.error = cause if interrupted else None
    self.context = context


# Runs a request's host function on the calling device thread:
# `run(consumer_id, device_id, arrays[, outputs[, stream]])` returns its
# results (None for none; views of the lent `outputs` once it filled them;
# a GPU's `stream` with its buffers, device_buffers.py) or raises
# `DirectRunError` (receiver/runner.py:HostFunctionRunner.direct_parts).
DirectRun = Callable[..., Optional[Sequence[np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class DirectRunParts:
  """What a transport runs requests' host functions on device threads
  with: `run` does it all. A transport may skip its frame for a request
  that is lent no buffers (every tap's): call the consumer of `consumers`
  (by id; read, never written) as `consumer(arrays, device_id)`, count the
  run in the queue's counts (`run_slots(device_id)`, the slots of
  `run_counts.QueueRuns`), and give an exception to `failed(consumer_id,
  error)`, which raises what `run` would; a consumer that is not there
  goes to `run`, which raises the error. The same transport may run a tap
  that waited on its queue, before a request, the same way (the native
  runner's `RunWaitingTaps`), giving its exception to
  `failed_queued(consumer_id, error)`, which records it as a receiver
  thread would and returns, or raises Ctrl-C's."""
  run: DirectRun
  consumers: Mapping[int, Callable[..., Any]]
  failed: Callable[[int, BaseException], NoReturn]
  failed_queued: Callable[[int, BaseException], None]
  run_slots: Callable[[int], Any]


class Reply:
  """The slot where the host puts the result of one `call` request.

  Owned by the sending (device) thread, which waits on it; the receiver
  thread fills it exactly once with either arrays or an error.
  """

  def __init__(self) -> None:
    self._done = threading.Event()
    self._arrays: Optional[Sequence[np.ndarray]] = None
    self._error: Optional[BaseException] = None

  @property
  def done(self) -> bool:
    return self._done.is_set()

  def set_result(self, arrays: Sequence[np.ndarray]) -> None:
    self._arrays = arrays
    self._done.set()

  def set_error(self, error: BaseException, context: str = "") -> None:
    """The device fails with `error`; `context` (e.g. which host function
    raised it) prefixes its message."""
    self._error = device_error(error, context)
    self._done.set()

  def wait(self, ensure_consumer: Callable[[], None]) -> Sequence[np.ndarray]:
    """Blocks until the reply is set; raises its error.

    `ensure_consumer()` runs at every poll: it starts a consumer if there is
    none, or raises (e.g. `ReceiverStopped`) to give up.
    """
    while not self._done.wait(POLL_SECONDS):
      ensure_consumer()
    if self._error is not None:
      raise self._error
    assert self._arrays is not None
    return self._arrays


@dataclasses.dataclass(slots=True)
class Packet:
  """What one device sends for one callback: a consumer id and its arrays
  (an int32 scalar that its site names as a Python int, see
  `transport.int_flags`)."""
  consumer_id: int
  device_id: int
  arrays: Sequence[Union[np.ndarray, int]]
  reply: Optional[Reply] = None

  @property
  def nbytes(self) -> int:
    """The bytes it counts in a Python queue's bound: its data and overhead."""
    return PACKET_OVERHEAD_BYTES + sum(
        ARRAY_OVERHEAD_BYTES + (4 if isinstance(a, int) else a.nbytes)
        for a in self.arrays)
