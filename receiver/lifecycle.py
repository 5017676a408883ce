"""The process-wide receiver: lazy start, stop, restart on next use, drain at exit."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import threading
from typing import (Callable, Deque, Dict, FrozenSet, Mapping, Optional,
                    Sequence, Set, Tuple)

from . import abandon
from .blocking import BlockingCalls
from .errors import ErrorLog
from .consumer_threads import Receiver
from .registry import ConsumerRegistry, Tickets
from .run_counts import QueueKey, RunCounts
from .runner import HostFunctionRunner
from .transport import Transport

logger = logging.getLogger("host_callback")

@dataclasses.dataclass(frozen=True)
class _Retired:
  """Consumers (and so their sites) that no executable can send to any
  more, and how many packets each queue had been sent when they were
  retired: every packet for them is among those."""
  consumer_ids: Sequence[int]
  sent: Optional[Mapping[QueueKey, int]]  # None: unknown


class Runtime:
  """Owns the consumer registry, the error log, the transports and the
  current receiver.

  The registry, the error log, the transports (with their device queues)
  and the counts of host functions run outlive receiver restarts. A device that sends while no receiver runs
  starts one. `_lock` guards `_receiver` and `_transports`; `_stop_lock`
  makes stops one at a time. Neither is held while host functions run.
  """

  def __init__(self, make_transports: Callable[[], Mapping[str, Transport]],
               max_bytes: Callable[[], int], at_exit: Callable[[], None],
               at_first_use: Callable[[], None] = lambda: None) -> None:
    """`at_exit` runs at interpreter exit if a queue was ever opened or a
    receiver started, and `at_first_use` at the first of those."""
    self.registry = ConsumerRegistry()
    self.tickets = Tickets()  # the eager ops' one-shot consumers
    self.errors = ErrorLog()
    self.runs = RunCounts()
    self.runner = HostFunctionRunner(self.registry, self.errors, self.runs)
    # What no executable uses any more, until its packets are consumed.
    self._retired: Deque[_Retired] = collections.deque()
    # The queues opened through `open_device`, readable without a lock.
    self._opened: Set[QueueKey] = set()
    # The devices of `_opened`, replaced (not changed) when one opens: read
    # without a lock on every barrier.
    self._open_device_ids: FrozenSet[int] = frozenset()
    self._release_lock = threading.Lock()  # one release_retired at a time
    self._make_transports = make_transports
    self._max_bytes = max_bytes
    self._lock = threading.RLock()
    self._stop_lock = threading.Lock()
    self._transports: Optional[Dict[str, Transport]] = None
    self._receiver: Optional[Receiver] = None
    self._at_exit = at_exit
    self._at_first_use = at_first_use
    self._at_exit_registered = False
    # For the drain at exit; started with its registration.
    self.blocking_calls = BlockingCalls()
    self._forked_while_running = False
    os.register_at_fork(after_in_child=self._after_fork_in_child)

  def _after_fork_in_child(self) -> None:
    """A forked child has none of the parent's receiver threads."""
    self._lock = threading.RLock()
    self._stop_lock = threading.Lock()
    if self._receiver is not None:
      self._receiver = None
      self._forked_while_running = True

  def check_usable(self) -> None:
    """Raises in a child forked while the parent's receiver was running."""
    if self._forked_while_running:
      raise RuntimeError(
          "host_callback cannot be used in a process created by os.fork() "
          "after the host_callback receiver had started in its parent: the "
          "receiver threads do not survive a fork. Start worker processes "
          "with multiprocessing's 'spawn' or 'forkserver' start method.")

  def idle_watches(self) -> Tuple[Tuple[object, str], ...]:
    """What is empty while no retired consumer waits to be released, no
    error to be raised and the process is usable, as (object, attribute),
    for the barrier's native idle check to read."""
    return ((self, "_retired"), (self, "_forked_while_running"),
            self.errors.pending_watch())

  def transports(self) -> Dict[str, Transport]:
    """The transports, created once; their restart hooks start a receiver."""
    transports = self._transports
    if transports is not None:
      return transports
    with self._lock:
      if self._transports is None:
        transports = dict(self._make_transports())
        for transport in transports.values():
          transport.set_restart_hook(self.receiver)
          transport.set_direct_runner(
              self.runner.direct_parts(transport.name))
          transport.set_nested_consumer(
              lambda device_id, transport=transport:
              self.receiver().consume_nested(transport, device_id))
          transport.set_guest_consumer(
              lambda device_id, transport=transport:
              self.receiver().consume_device_here(transport, device_id))
        self._transports = transports
      return self._transports

  def receiver(self) -> Receiver:
    """The current receiver (perhaps stopping); starts one if there is none."""
    self.check_usable()
    receiver = self._receiver
    if receiver is not None:
      return receiver
    transports = self.transports()
    with self._lock:
      if self._receiver is None:
        max_bytes = self._max_bytes()
        self._receiver = Receiver(transports, max_bytes, self.runner)
        logger.debug("host_callback: receiver started (transports %s; at "
                      "most %d bytes waiting per device)",
                      ", ".join(transports), max_bytes)
        self._register_at_exit()
      return self._receiver

  def _register_at_exit(self) -> None:
    """Under `_lock`: the drain at exit runs once a queue opened (a
    computation of ours was lowered) or a receiver started. A program whose
    host functions all ran on device threads starts no receiver, and may
    still have computations in flight at exit, which JAX does not wait for
    (they carry no JAX effect): their host functions would take the GIL in
    a finalizing interpreter, which ends their threads, and the process
    aborts."""
    if not self._at_exit_registered:
      atexit.register(self._at_exit)
      self._at_exit_registered = True
      self._at_first_use()
      self.blocking_calls.start()

  def idle(self, device_id: int) -> bool:
    """Whether no packet of the device waits on any opened queue."""
    transports = self._transports or {}
    return not any(transports[name].stats(device_id).packets_waiting
                   for name, opened in tuple(self._opened)
                   if opened == device_id and name in transports)

  def open_device_ids(self) -> FrozenSet[int]:
    """The devices whose queues are open, on any transport."""
    return self._open_device_ids

  def open_device(self, name: str, device_id: int) -> None:
    """Opens a device's queue on the transport called `name`."""
    self.transports()[name].open_device(device_id)
    self._opened.add((name, device_id))
    if device_id not in self._open_device_ids:
      self._open_device_ids = self._open_device_ids | {device_id}
    with self._lock:
      self._register_at_exit()

  def _close_direct_runs(self) -> None:
    for transport in (self._transports or {}).values():
      transport.close_direct_runs()

  def _sent(self) -> Dict[QueueKey, int]:
    """Packets sent so far by each opened queue. Takes no lock but the
    Python queues' own (reentrant) ones, so a finalizer may call it."""
    transports = self._transports or {}
    return {(name, device_id): transports[name].packets_sent(device_id)
            for name, device_id in tuple(self._opened)
            if name in transports}

  def _consumed(self, sent: Optional[Mapping[QueueKey, int]]) -> bool:
    """Whether each queue has consumed (and released) its first `sent[key]`
    packets (all it was sent, when `sent` is None). Reads the count sent
    before the count waiting, so that their difference never overstates
    what was consumed."""
    transports = self._transports or {}
    if sent is None:
      return all(self.idle(device_id) for _, device_id in tuple(self._opened))
    for (name, device_id), count in sent.items():
      if not count:
        continue
      transport = transports[name]
      now = transport.packets_sent(device_id)
      if now - transport.stats(device_id).packets_waiting < count:
        return False
    return True

  def retire(self, consumer_ids: Sequence[int]) -> None:
    """Consumers (and so their sites) that no executable can send to any
    more.

    Called by a finalizer, so on any thread and at any allocation: it takes
    no lock that a thread holds while it allocates. When every packet for
    them has been consumed already (the usual case, after a barrier), the
    consumers, and so the host functions and their closures, are dropped at
    once; `release_retired` frees the rest (the sites, and the consumers
    whose packets were still waiting) once their packets are consumed.
    """
    try:
      retired = _Retired(tuple(consumer_ids), self._sent())
      if self._consumed(retired.sent):
        self.registry.discard(retired.consumer_ids)
    except Exception:  # pylint: disable=broad-except
      # Counts unknown: freed once every queue is idle.
      retired = _Retired(tuple(consumer_ids), None)
    self._retired.append(retired)

  def release_retired(self) -> None:
    """Releases the retired consumers and sites whose packets (those sent
    before they were retired) have all been consumed; the others wait for
    a later call (at the next registration or barrier_wait)."""
    if not self._retired or self._transports is None:
      return
    with self._release_lock:
      for _ in range(len(self._retired)):  # finalizers may append meanwhile
        retired = self._retired.popleft()
        if not self._consumed(retired.sent):
          self._retired.append(retired)
          continue
        self.registry.remove(retired.consumer_ids)
        for transport in self._transports.values():
          transport.unregister_sites_of(retired.consumer_ids)

  def running_receiver(self) -> Optional[Receiver]:
    return self._receiver

  def consume_here(self, limit: int) -> bool:
    """See `Receiver.consume_here`; False without a receiver."""
    receiver = self._receiver
    return receiver is not None and receiver.consume_here(limit)

  def stop(self) -> None:
    """Drains and stops the receiver. Packets sent meanwhile stay queued, and
    a new receiver starts at once for them, or when a device next sends."""
    with self._stop_lock:
      receiver = self._receiver
      if receiver is None:
        return
      receiver.stop()
      _log_stopped(receiver)
      with self._lock:
        self._receiver = None
        pending = receiver.detach()
      if pending:
        self.receiver()

  def shut_down(self, drain: bool = True) -> None:
    """At exit: stops for good; a device that sends from now on fails.
    Without `drain` (the drain was interrupted), waits for no host
    function: a thread that runs one is left to end with the process."""
    if self._transports is not None:
      for transport in self._transports.values():
        transport.clear_restart_hook()
    with self._stop_lock:
      receiver, self._receiver = self._receiver, None
      if receiver is not None:
        # Undrained, its idle threads still end (in POLL_SECONDS), before
        # the interpreter, which would end them inside the native module.
        receiver.stop(timeout=60.0 if drain else 1.0, drain=drain)
        _log_stopped(receiver)
        receiver.detach()

  def abandon(self, why: str,
              executions_running: Callable[[], Optional[int]]) -> None:
    """After Ctrl-C at exit: no host function begins any more; when any
    runs, was dropped or may still be called (`executions_running()`,
    None where not counted), writes what was left to stderr, beginning
    with `why`, and ends the process at once (`receiver/abandon.py`).
    Returns only when nothing was left."""
    abandon.abandon(self.runs, self._close_direct_runs, self._sent,
                    executions_running, why)


def _log_stopped(receiver: Receiver) -> None:
  """Logs a stop, with each queue's high-water mark."""
  if not logger.isEnabledFor(logging.DEBUG):
    return  # skips reading every queue's statistics
  logger.debug("host_callback: receiver stopped")
  for (name, device_id), stats in sorted(receiver.queue_stats().items()):
    logger.debug("host_callback: %s queue of device %d: high water %d of %d "
                 "bytes", name, device_id, stats.high_water_bytes,
                 stats.max_bytes)
