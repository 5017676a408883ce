"""The one runner of host functions: how a run is counted, how its failure
is recorded, and how a Ctrl-C in it is told from the host function's own
KeyboardInterrupt, for every route ("Where a host function runs" in
docs/architecture.md).

- `run_queued`: a packet taken from a device's queue, by its receiver
  thread, a guest (a barrier, or a request that finds taps waiting before
  it) or a nested consumer. `run_taken` runs a receiver thread's packets
  that wait for no reply as it would, in C where the native module is
  built (`native/python_consume.cc`).
- `direct_parts(name)`: a request run on the device's own thread
  (`DirectRunParts`). The native runner (`native/python_runner.cc:
  CallConsumer`) skips `run`'s Python frame for a request lent no buffers:
  it counts in the same `QueueRuns` slots and fails through the same
  `failed` and `failed_queued`, so it keeps these rules, not its own.
- `run_here`: an eager op's host function on the calling thread.

Every run is counted in its queue's `run_counts.QueueRuns` (`run_here`'s,
with nothing in flight, is not), every failure recorded in the one
`ErrorLog`, and Ctrl-C classified by `ctrl_c.stopped_by_ctrl_c`.
"""

from __future__ import annotations

from typing import (Any, Callable, Deque, Dict, List, NoReturn, Optional,
                    Sequence)

import numpy as np

from . import native_library
from .consumer_threads import consumer_thread
from .ctrl_c import stopped_by_ctrl_c
from .errors import ErrorLog
from .packets import (DirectRunError, DirectRunParts, Packet, ReceiverStopped,
                      device_error)
from .registry import Consumer, ConsumerRegistry
from .run_counts import QueueRuns, RunCounts


class HostFunctionRunner:
  """Runs the consumers of `registry`, counting in `runs` and recording
  failures in `errors`."""

  def __init__(self, registry: ConsumerRegistry, errors: ErrorLog,
               runs: RunCounts) -> None:
    self.registry = registry
    self.errors = errors
    self.runs = runs
    self._run_taken = native_library.taken_runner()

  def run_queued(self, packet: Packet, runs: QueueRuns,
                 raise_interrupt: bool = False) -> None:
    """Runs the packet's consumer and replies to a request, counted in
    `runs`; once they are closed (the process ends), drops it. An error,
    also one in delivering the reply (e.g. results the device cannot
    take), is recorded for the barrier and, for a request, fails the
    device; with `raise_interrupt`, Ctrl-C on the main thread fails the
    device, and is raised instead."""
    if not runs.begin():
      return
    try:
      consumer = self.registry.get(packet.consumer_id)
      result = consumer(packet.arrays, packet.device_id)
      if packet.reply is not None:
        packet.reply.set_result(result if result is not None else ())
    except BaseException as error:  # pylint: disable=broad-except
      # From the consumer's frame on, as the C loops that run consumers
      # record it (a builtin host function's error shows no frame).
      error.__traceback__ = error.__traceback__.tb_next
      waiting = packet.reply is not None and not packet.reply.done
      interrupted = self._queued_failed(error, raise_interrupt,
                                        delivered=packet.reply is not None)
      if waiting:
        packet.reply.set_error(error,
                               self.registry.context(packet.consumer_id))
      if interrupted:
        raise
    finally:
      runs.end()

  def run_taken(self, taken: Deque[Packet], runs: QueueRuns,
                mark_finished: Callable[[int, Packet], None],
                mark_count_finished: Optional[Callable[[int, int], None]],
                device_id: int) -> None:
    """Runs packets from the left of `taken`, a receiver thread's, as
    `run_queued` would (no Ctrl-C is raised there), then
    `mark_finished(device_id, packet)` each, or where given
    `mark_count_finished(device_id, count)` once for them all; stops at the
    first that waits for a reply, whose consumer is gone, or once the
    counts are closed, which `run_queued` runs. Where the native module is
    not built, runs none."""
    if self._run_taken is not None:
      self._run_taken(taken, taken.popleft, self.registry.consumers,
                      self.runs, runs.slots, self._tap_failed, mark_finished,
                      mark_count_finished, device_id)

  def _tap_failed(self, error: BaseException) -> None:
    """What `run_queued` does when a receiver thread's tap raised."""
    self._queued_failed(error, raise_interrupt=False, delivered=False)

  def _queued_failed(self, error: BaseException, raise_interrupt: bool,
                     delivered: bool) -> bool:
    """Records a queued host function's `error`, unless Ctrl-C stopped it
    where the caller raises that (`raise_interrupt`): returns whether it
    did."""
    interrupted = raise_interrupt and stopped_by_ctrl_c(error)
    if not interrupted:
      self.errors.record(error, delivered=delivered)
    return interrupted

  def direct_parts(self, name: str) -> DirectRunParts:
    """How transport `name` runs a request's consumer on the calling device
    thread, as its receiver thread would: `run(consumer_id, device_id,
    arrays[, outputs[, stream]])` records an error, then raises it as
    `DirectRunError` (`failed`). Once the counts are closed (the process
    ends), refuses. The transport marks the thread as running host
    functions (`in_consumer_thread`). `outputs`, the device's result
    buffers lent to a call's consumer (the native runner lends them to a
    copy=False site's), go to the consumer, which may fill them and return
    views of them. On a GPU (a buffers=True site's call) `arrays` and
    `outputs` are `device_buffers.CudaBuffer`s and `stream` the
    computation's, which the consumer also gets; it writes the results
    into `outputs` on that stream."""
    # What does not change between runs is bound here.
    runs_by_device: Dict[int, QueueRuns] = {}
    counts, registry = self.runs, self.registry
    lookup = registry.consumers.get

    def failed(consumer_id: int, error: BaseException) -> NoReturn:
      self.errors.record(error, delivered=True)  # the device fails with it
      raise DirectRunError(error, registry.context(consumer_id),
                           interrupted=stopped_by_ctrl_c(error)) from error

    def run_direct(consumer_id: int, device_id: int, arrays: List[Any],
                   outputs: Optional[Sequence[Any]] = None,
                   stream: Optional[int] = None) -> Optional[Sequence[Any]]:
      runs = runs_by_device.get(device_id)
      if runs is None:
        runs = runs_by_device[device_id] = counts.of(name, device_id)
      if not runs.begin_direct():
        raise ReceiverStopped("host_callback: the process is ending after "
                              "Ctrl-C; host functions no longer run")
      try:
        consumer = lookup(consumer_id)
        if consumer is None:
          consumer = registry.get(consumer_id)  # raises: it was released
        if outputs is None:
          return consumer(arrays, device_id)
        if stream is None:
          return consumer(arrays, device_id, outputs)
        return consumer(arrays, device_id, outputs, stream)
      except BaseException as error:  # pylint: disable=broad-except
        failed(consumer_id, error)
      finally:
        runs.end()

    def failed_queued(consumer_id: int, error: BaseException) -> None:
      del consumer_id  # the error names its host function
      if self._queued_failed(error, raise_interrupt=True, delivered=False):
        raise error

    return DirectRunParts(run_direct, registry.consumers, failed,
                          failed_queued, counts.slots_of(name))

  def run_here(self, consumer: Consumer, context: str, device_id: int,
               arrays: List[np.ndarray]) -> Optional[Sequence[np.ndarray]]:
    """Runs an unregistered consumer on the calling thread as a direct run
    does, and raises what a device that waited for it would."""
    with consumer_thread():
      try:
        return consumer(arrays, device_id)
      except BaseException as error:  # pylint: disable=broad-except
        self.errors.record(error, delivered=True)  # the caller gets it
        raised = device_error(error, context)  # chained to `error`
        if raised is error:
          raise
        raise raised  # pylint: disable=raise-missing-from
