"""`barrier_wait` and `stop_outfeed_receiver`: probes, or a marker through
each device.

On CPU the barrier first waits for a probe per device (see `probes`): when
they are ready, every computation that this thread dispatched so far to
those devices has finished, whatever their inputs waited for. Then, unless
one of ours still runs (another thread's; they count their executions once
begun, see `executions`),
what is left is the packets they sent, and the barrier waits until the
consumers have run them. It visits none of the program's arrays.

Otherwise (another thread's computation runs, or a device is not a CPU), as
the original did, the barrier runs one tiny tap computation on every local
device whose queue is open, on each transport. A device's consumer thread
runs host functions in the order the device sent them: when a marker's tap
has run, every callback sent before the marker has run too. Before each
round of markers the barrier waits for a moment when none of our
computations is running, and it repeats the markers while computations
begin or packets arrive that they did not account for.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from .. import _jax_adapter as adapter
from ..primitive import executions, primitive
from . import idle, probes
from ..host import host_side
from .. import settings
from ..host.device_numbers import (device_number, local_devices_by_number,
                                   zero_on)
from ..host.host_functions import TapParams
from ..receiver import POLL_SECONDS, ctrl_c, in_consumer_thread

logger = logging.getLogger("host_callback")
# After taps arrived that the markers did not account for, the barrier waits
# for marker rounds that stay quiet this long; it gives up after this many
# rounds (another thread may be tapping without pause).
_SETTLE_SECONDS = 0.02
_MAX_ROUNDS = 500
# A computation that stays in flight this long while no packet is sent or
# waits, when every computation dispatched has finished (`probes`), was
# stopped by an op that is not ours (say, a jax.pure_callback that raised),
# which never counts it as ended, or is another thread's, inside a long op
# between two callbacks; the barrier stops waiting for it. Where no other
# thread can have dispatched it (`_others_may_dispatch`), it was stopped:
# the barrier stops waiting at once.
_STALLED_SECONDS = 2.0
# Threads that dispatch no computation of ours themselves, by name prefix:
# our receivers (what their host functions dispatch sends packets first)
# and tqdm's monitor. Threads that Python did not start (XLA's, which run
# host functions on the devices' threads) do not either.
_NOT_DISPATCHING = ("host_callback_", "tqdm_monitor")

# (transport name, device id)
_Key = Tuple[str, int]

# Called after each barrier has waited: the progress bars close the bars
# whose loops ended unseen. Appended to at import only. With each, the
# (object, attribute) pairs that are empty while it has nothing to do: an
# idle barrier skips it then (`idle`, which watches them).
_after_wait: List[Callable[[], None]] = []
_after_wait_idle_when_empty: List[Tuple[Any, str]] = []


def after_each_wait(listener: Callable[[], None],
                    idle_when_empty: Sequence[Tuple[Any, str]]) -> None:
  """Calls `listener()` after each barrier has waited, before it raises a
  recorded error; what it raises is logged and dropped. `listener` has
  nothing to do while the attributes `idle_when_empty` names, as (object,
  attribute) pairs, are empty: an idle barrier then does not call it."""
  if listener not in _after_wait:
    _after_wait.append(listener)
    _after_wait_idle_when_empty.extend(idle_when_empty)
    idle.reconfigure()


def _waited() -> None:
  for listener in tuple(_after_wait):
    try:
      listener()
    except Exception:  # pylint: disable=broad-except
      logger.exception("host_callback: a barrier listener raised")


class _Markers:
  """Markers dispatched and arrived, per (transport, device), by number.

  Each marker carries its number. The condition's lock guards both tables.
  """

  def __init__(self) -> None:
    self._cond = threading.Condition()
    self._dispatched: Dict[_Key, int] = collections.defaultdict(int)
    self._arrived: Dict[_Key, int] = collections.defaultdict(int)

  def next_number(self, key: _Key) -> int:
    with self._cond:
      self._dispatched[key] += 1
      return self._dispatched[key]

  def arrive(self, key: _Key, number: int) -> None:
    with self._cond:
      self._arrived[key] = max(self._arrived[key], number)
      self._cond.notify_all()

  def wait(self, targets: Dict[_Key, int]) -> None:
    """Waits until marker `targets[key]`, or a later one, arrived for every
    key: a later marker proves the same for the barrier, and one that never
    arrives (its dispatch was interrupted) holds no later barrier up."""
    with self._cond:
      while any(self._arrived[key] < target for key, target in targets.items()):
        self._cond.wait(POLL_SECONDS)


_markers = _Markers()


# On the thread running a marker round: the markers whose tap ran right there
# (the device's queue was idle), rather than on the receiver thread.
_round = threading.local()


def _marker_tap(name: str, number: Any, transforms: Any, *, device: Any) -> None:
  del transforms
  ran_here = getattr(_round, "ran_here", None)
  if ran_here is not None:
    ran_here.add((name, device_number(device)))
  _markers.arrive((name, device_number(device)), int(number))


@functools.lru_cache(maxsize=None)
def _marker_computation(name: str) -> Any:
  """A jitted tap whose host function counts the marker's arrival."""
  function = TapParams(func=functools.partial(_marker_tap, name),
                       arg_treedef=jax.tree_util.tree_structure(0),
                       with_device=True)
  # `on_device`, a zero committed to a device, places the computation there
  # (so it must be used); the marker's number, a Python int, follows it,
  # which costs less than a device_put.
  return jax.jit(lambda on_device, number: primitive.bind(
      [on_device + number], function=function, num_args=1, device_index=0)[0])


def _marker(name: str, device: int) -> Callable[[jax.Array, np.int32], Any]:
  """The marker of a transport for one local device, called in the marker
  round's settings: jitted, which JAX's C++ dispatch runs, except from code
  that JAX is tracing, where a jitted call would be staged into that code
  and never run."""
  if adapter.tracing():
    return _compiled_marker(name, device)
  return _marker_computation(name)


@functools.lru_cache(maxsize=None)
def _compiled_marker(name: str, device: int) -> Any:
  """The marker of a transport, compiled for one local device. JAX calls
  it through its Python dispatch (a compiled executable with host
  callbacks has no C++ call), slow on a GPU (docs/gpu.md)."""
  on_device = zero_on(local_devices_by_number()[device])
  # The number is an int32 whatever jax_enable_x64 says when it is
  # compiled or run (_run_marker).
  return _marker_computation(name).lower(on_device, np.int32(0)).compile()


class _InFlight:
  """Waits for moments when none of our computations is running, except
  those given up on: a foreign op stopped them (see _STALLED_SECONDS)."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._given_up = 0

  def given_up_watch(self) -> Tuple[Any, str]:
    """Where the count of executions in flight given up on lives, as
    (object, attribute), for the native idle check (`idle`) to read."""
    return self, "_given_up"

  def none(self) -> bool:
    """Whether none is running now, but those given up on."""
    with self._lock:
      return executions.counts()[1] <= self._given_up

  def wait(self) -> None:
    executions.reset_low_water()
    delay, last, last_change = 1e-4, None, time.monotonic()
    while True:
      begun, in_flight, low_water = executions.counts()
      fewest = min(in_flight, low_water)
      with self._lock:
        if fewest <= self._given_up:
          self._given_up = fewest
          return
      now = time.monotonic()
      sent, waiting = _queue_activity()
      state = (begun, in_flight, sent, waiting)
      if state != last or waiting:
        last, last_change = state, now
      else:
        others = _others_may_dispatch()
        if not others or now - last_change >= _STALLED_SECONDS:
          # Only computations on CPU count their executions.
          if not probes.cpu_finished(host_side.runtime.open_device_ids()):
            last_change = now  # a long computation, still running
          else:
            self._give_up(in_flight, now - last_change, others)
            return
      time.sleep(delay)
      delay = min(2 * delay, POLL_SECONDS)

  def _give_up(self, in_flight: int, seconds: float, others: bool) -> None:
    with self._lock:
      stuck = in_flight - self._given_up
      self._given_up = in_flight
    if not others:
      logger.info(
          "host_callback.barrier_wait: %d computation(s) with taps or calls "
          "failed in an op that is not host_callback's (their outputs hold "
          "the error); not waiting for them.", stuck)
      return
    logger.warning(
        "host_callback.barrier_wait: %d computation(s) with taps or calls "
        "began and made no progress for %.1f s; not waiting for them. If "
        "one failed in an op that is not host_callback's (its outputs hold "
        "the error), this is expected; otherwise it is another thread's "
        "computation, running a long op between two callbacks.", stuck,
        seconds)


_in_flight = _InFlight()


def _others_may_dispatch() -> bool:
  """Whether a live Python thread other than this one may have dispatched
  a computation of ours that still runs: the probes follow only this
  thread's."""
  current = threading.current_thread()
  return any(thread is not current and
             not thread.name.startswith(_NOT_DISPATCHING) and
             not isinstance(thread, threading._DummyThread)  # pylint: disable=protected-access
             for thread in threading.enumerate())


def _queue_activity() -> Tuple[int, int]:
  """Packets sent ever and waiting now, on all queues."""
  sent = waiting = 0
  for transport in host_side.runtime.transports().values():
    for device_id in transport.device_ids():
      sent += transport.packets_sent(device_id)
      waiting += transport.stats(device_id).packets_waiting
  return sent, waiting


def _run_marker(marker: Any, on_device: jax.Array, number: int) -> None:
  """Runs a marker. Ctrl-C that stops it fails its computation and is
  re-armed for the next line of Python (receiver/ctrl_c.py): this
  handler, inside the caller's `with` of the marker's settings, whose exit
  it would otherwise stop half-way, leaving this thread on the marker's
  transport and mode. Where none is pending, the cancelled marker is
  raised as KeyboardInterrupt."""
  try:
    marker(on_device, np.int32(number))
  except Exception as error:  # pylint: disable=broad-except
    if ctrl_c.cancelled_by_ctrl_c(error):
      raise KeyboardInterrupt from error
    raise


def _marker_round() -> bool:
  """Puts a marker on every open local device queue and waits for all.

  Returns whether nothing but the markers began or arrived meanwhile.
  """
  local = local_devices_by_number()
  _round.ran_here = ran_here = set()
  targets: Dict[_Key, int] = {}
  sent_before: Dict[_Key, int] = {}
  transports = host_side.runtime.transports()
  begun_before = executions.counts()[0]
  for name, transport in transports.items():
    device_ids = [d for d in transport.device_ids() if d in local]
    if not device_ids:
      continue
    # A synchronous marker is a request: it wakes the consumer at once, and
    # on an idle native queue runs on the dispatching thread.
    with (settings.transport(name), settings.outfeed(False),
          adapter.outside_the_program_mesh()):
      for device_id in device_ids:
        key = (name, device_id)
        sent_before[key] = transport.packets_sent(device_id)
        targets[key] = _markers.next_number(key)
        _run_marker(_marker(name, device_id), zero_on(local[device_id]),
                    targets[key])
  _round.ran_here = None
  _markers.wait(targets)
  # Each marker is one execution; a marker that ran here was not queued,
  # one handed off was.
  return (executions.counts()[0] - begun_before <= len(targets) and
          all(transports[key[0]].packets_sent(key[1]) ==
              sent + (key not in ran_here)
              for key, sent in sent_before.items()))


def _wait_for_devices() -> bool:
  """Waits until every callback of the computations dispatched so far ran;
  returns whether the CPU probes covered every device.

  On CPU the probes say when every computation that this thread
  dispatched so far has finished; then, unless one of ours still runs
  (another thread's, begun), what is
  left is the packets they sent. Elsewhere, or then, marker rounds: one
  quiet round suffices when nothing else happens; after packets arrived or
  computations began that the markers did not account for, quiet rounds
  for _SETTLE_SECONDS are needed, since stragglers may still follow.
  """
  dispatched, covered = probes.dispatch(host_side.runtime.open_device_ids())
  # With a device that is not a CPU, the CPU probes still cover what a
  # marker on a CPU device cannot see: a computation over several devices
  # whose inputs were not ready.
  probes.wait_for(dispatched)
  if covered:
    # A host function that runs JAX code sends more packets, and its own
    # may finish first: wait until every queue is drained. What waits on a
    # queue that no receiver thread is busy with runs here, at once.
    for _ in range(_MAX_ROUNDS):
      if not _in_flight.none():
        break
      if host_side.queues_drained():
        return True
      if not host_side.runtime.consume_here(idle.CONSUMED_HERE):
        host_side.wait_released()
  busy, quiet_since = False, None
  for _ in range(_MAX_ROUNDS):
    started = time.monotonic()
    _in_flight.wait()
    if not _marker_round():
      busy, quiet_since = True, None
      continue
    if not busy:
      break
    quiet_since = started if quiet_since is None else quiet_since
    if time.monotonic() - quiet_since >= _SETTLE_SECONDS:
      break
  host_side.wait_released()
  return covered


def _release_runtime_tokens() -> None:
  """Lets JAX drop what it keeps of this thread's finished computations on
  the devices just waited for: their runtime tokens, which on a GPU may keep
  a dropped jitted function's host functions alive (as
  `jax.effects_barrier()` does for JAX's own callbacks)."""
  adapter.release_finished_runtime_tokens(_waited_for)


def _waited_for(device: Any) -> bool:
  """Whether the barrier waited for every computation this thread
  dispatched to `device`: a device with an open queue (the probes on CPU,
  and elsewhere the markers, which follow them in the device's order)."""
  return device_number(device) in host_side.runtime.open_device_ids()


def _check_not_in_consumer(api: str) -> None:
  if in_consumer_thread():
    raise RuntimeError(
        f"host_callback.{api} was called from inside a host callback "
        "function; it would wait for itself. Call it from the main program.")


def _idle_once_run_here() -> bool:
  """Where the CPU probes cover every open device (where a barrier may be
  idle at all), runs here what waits on queues that no receiver thread is
  busy with; then whether the barrier is idle: in the outfeed mode, after
  steps that have finished (see `idle`), their taps were all that was
  left. Elsewhere the markers go through the receiver threads, as
  before."""
  return (probes.cover(host_side.runtime.open_device_ids()) and
          host_side.runtime.consume_here(idle.CONSUMED_HERE) and idle.now())


def barrier_wait(logging_name: Optional[str] = None) -> None:
  """Blocks until every callback from computations already started is done.

  Covers every local device and computations dispatched from any Python
  thread. Then raises `CallbackException` if a callback raised since the last
  barrier.
  """
  is_idle = idle.now()
  logs = logger.isEnabledFor(logging.DEBUG)
  if is_idle and not logs:
    return  # nothing to wait for, release, raise, call or log
  _check_not_in_consumer("barrier_wait")
  host_side.runtime.check_usable()
  if logs:
    logger.debug("barrier_wait[%s]: start", logging_name)
  if not is_idle and _idle_once_run_here():
    is_idle = True
  if not is_idle:
    idle.begin(_in_flight, _after_wait_idle_when_empty)
    idle.waited(_wait_for_devices())
    _release_runtime_tokens()
  if logs:
    logger.debug("barrier_wait[%s]: done", logging_name)
  host_side.runtime.release_retired()
  _waited()
  host_side.raise_recorded_error()


# The barrier as users call it: an idle one returns from C, with no Python
# frame (`idle.with_idle_check`); any other runs the function above.
barrier_wait = idle.with_idle_check(
    barrier_wait, functools.partial(logger.isEnabledFor, logging.DEBUG))


def stop_outfeed_receiver() -> None:
  """See `host_callback.stop_outfeed_receiver`."""
  _check_not_in_consumer("stop_outfeed_receiver")
  host_side.runtime.check_usable()
  _wait_for_devices()
  _release_runtime_tokens()
  _waited()
  host_side.runtime.stop()


host_side.set_exit_barrier(barrier_wait)  # the drain at interpreter exit
