"""Connects JAX devices to the receiver: transports, consumers, stop, exit."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import sys
import threading
import weakref
from typing import (Any, Callable, Dict, FrozenSet, List, Optional, Sequence,
                    Set, Tuple, TypeVar, Union)

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import native_handlers, settings
from .devices import device_by_number, device_number
from .host_functions import CallError, HostFunction, Transforms, make_consumer
from .receiver import (Consumer, PythonTransport, QueueStats, Runtime,
                       Transport)
from .receiver import native_library, transport_native

T = TypeVar("T")


def native_available() -> bool:
  """Whether the native transport was built, loads, and XLA took its CPU
  handlers."""
  return native_handlers.accepted("cpu")


def available_transports() -> List[str]:
  """The transports this installation can use."""
  return ["python", "native"] if native_available() else ["python"]


def _make_transports() -> Dict[str, Transport]:
  transports: Dict[str, Transport] = {"python": PythonTransport()}
  if native_available():
    transports["native"] = transport_native.NativeTransport()
  return transports


def transport(name: str) -> Transport:
  """The process's transport called `name` ('native' or 'python')."""
  return _runtime.transports()[name]


def transports() -> Dict[str, Transport]:
  """The process's transports, by name."""
  return _runtime.transports()


@dataclasses.dataclass
class _Registrations:
  """What the receiver holds for one live host function: a consumer per
  `transforms`, and the sites of its compiled operations."""
  consumer_ids: Dict[Transforms, int] = dataclasses.field(default_factory=dict)
  # A transport gives one site again to a lowering with the same layout.
  sites: Set[Tuple[str, int]] = dataclasses.field(default_factory=set)


_registrations: "weakref.WeakKeyDictionary[HostFunction, _Registrations]" = (
    weakref.WeakKeyDictionary())
_registrations_lock = threading.Lock()


def _registrations_of(function: HostFunction) -> _Registrations:
  """Created at the first registration; when `function` dies (no jaxpr or
  executable holds it), its consumers and sites are retired. Not at exit
  (a finalizer's default): the drain at exit may still run them."""
  registrations = _registrations.get(function)
  if registrations is None:
    registrations = _registrations[function] = _Registrations()
    weakref.finalize(function, _retire, registrations).atexit = False
  return registrations


def _retire(registrations: _Registrations) -> None:
  _runtime.retire(list(registrations.consumer_ids.values()),
                  list(registrations.sites))


def open_device(producer: Transport, device_id: int) -> None:
  """Opens the queue of a device that may send to `producer`."""
  _runtime.open_device(producer.name, device_id)


def open_device_numbers() -> FrozenSet[int]:
  """The devices whose queues are open, on any transport: a computation of
  ours opens the queues of its devices when it is lowered."""
  return _runtime.open_device_ids()


def _context(function: HostFunction) -> str:
  """What names `function` in the error of a device that waited for it
  (a call's own errors name it)."""
  return ("" if function.is_call else
          f"host_callback.id_tap: the tap function {function.name}")


def register(function: HostFunction, transforms: Transforms) -> int:
  """The consumer id for `function` under `transforms`."""
  _runtime.release_retired()
  with _registrations_lock:
    registrations = _registrations_of(function)
    consumer_id = registrations.consumer_ids.get(transforms)
    if consumer_id is None:
      consumer: Consumer
      context: Union[str, Callable[[], str]]
      if function.func is _dispatch:
        consumer, context = _dispatch, _dispatch_context
      else:
        context = _context(function)
        # The consumer holds a copy: the receiver must not keep `function`
        # alive, or it would never be retired.
        consumer = make_consumer(dataclasses.replace(function), transforms,
                                 device_by_number)
      consumer_id = registrations.consumer_ids[transforms] = (
          _runtime.registry.add(consumer, context))
    return consumer_id


# --- Eager operations: one compiled op per signature, the host function
# chosen at run time. The op's host function is `_dispatch`; each execution
# sends, before the operands, a ticket that names the consumer to run. The
# ticket holds the consumer (so the host function) until it has run. -------

_tickets: Dict[int, Tuple[Consumer, str]] = {}
_ticket_numbers = itertools.count()
_TICKET_MASK = 0x7FFFFFFF  # tickets travel as int32 scalars
_failed = threading.local()  # the context of the last consumer that raised


def _dispatch(arrays: Sequence[np.ndarray], device_id: int
              ) -> Optional[Sequence[np.ndarray]]:
  """The consumer of eager ops: runs the one that the ticket names."""
  consumer, context = _tickets.pop(int(arrays[0]))
  try:
    return consumer(arrays[1:], device_id)
  except BaseException:
    _failed.context = context  # read by the registry right after, here
    raise


def _dispatch_context() -> str:
  return getattr(_failed, "context", "")


@functools.lru_cache(maxsize=None)
def eager_function(is_call: bool, result_avals: Tuple[Any, ...]
                   ) -> HostFunction:
  """The host function of the eager ops with this signature."""
  return HostFunction(_dispatch, None, with_device=False, is_call=is_call,
                      result_avals=result_avals)


def is_eager_function(function: HostFunction) -> bool:
  return function.func is _dispatch


def eager_ticket(function: HostFunction, transforms: Transforms) -> int:
  """A ticket for an eager op to run `function` under `transforms` with."""
  ticket = next(_ticket_numbers) & _TICKET_MASK
  _tickets[ticket] = (make_consumer(function, transforms, device_by_number),
                      _context(function))
  return ticket


def run_eager(function: HostFunction, transforms: Transforms,
              arrays: Sequence[np.ndarray], device: Any) -> Any:
  """Runs `function` now, on the calling thread, if `device` has no packet
  waiting (else returns NotImplemented): the synchronous mode's eager taps
  and calls, whose arguments are ready. As a request run on the device
  thread: an error is recorded for barrier_wait and raised as the device's
  error."""
  number = device_number(device)
  if not _runtime.idle(number):
    return NotImplemented  # the eager op queues behind those packets
  consumer = make_consumer(function, transforms, device_by_number)
  try:
    return _runtime.run_here(consumer, _context(function), number,
                             list(arrays))
  except Exception as error:  # pylint: disable=broad-except
    # What the compiled op's caller gets: JAX's error for a failed
    # computation, with the device's message, chained to the cause.
    raised = jax.errors.JaxRuntimeError(f"INTERNAL: {error}")
    raise raised from (error.__cause__ or error)


def drop_ticket(ticket: int) -> None:
  """Forgets a ticket whose op failed before its host function ran."""
  _tickets.pop(ticket, None)


def register_site(producer: Transport, function: HostFunction,
                  transforms: Transforms, dtypes: Sequence[np.dtype],
                  shapes: Sequence[Tuple[int, ...]]) -> int:
  """A new site of `producer` for `function` under `transforms`."""
  site = producer.register_site(
      register(function, transforms), dtypes, shapes, name=function.name,
      copy=function.copy,
      result_dtypes=[a.dtype for a in function.result_avals])
  with _registrations_lock:
    _registrations_of(function).sites.add((producer.name, site))
  return site


def release_retired() -> None:
  """Frees what dead host functions held, if their packets are consumed."""
  _runtime.release_retired()


def run_inline(function: HostFunction, transforms: Transforms,
               arrays: Sequence[np.ndarray], device: Any) -> Any:
  """Runs a host function in the caller's thread (inline mode).

  As in the original, what the host function raises reaches the caller as
  itself (a `call`'s context is added as a note), and not `barrier_wait`.
  """
  consumer = _runtime.registry.get(register(function, transforms))
  try:
    return consumer(arrays, device_number(device))
  except CallError as error:
    if error.__cause__ is None:  # a result that does not match result_shape
      raise
    error.__cause__.add_note(str(error))
    raise error.__cause__ from None


def check_usable() -> None:
  """Raises in a child forked while the parent's receiver was running."""
  _runtime.check_usable()


def raise_recorded_error() -> None:
  """Raises `CallbackException` for the last host function error, if any.

  In the synchronous mode, as in the original's, an error that failed the
  computation waiting for it (its caller got it) is not raised again; in
  the outfeed mode a `call`'s error is, as the original's was.
  """
  errors = _runtime.errors
  if not errors.pending():
    return
  if errors.delivered_pending():
    _forget_delivered_errors()
  errors.raise_if_any(
      include_delivered=settings.outfeed_mode(jax.default_backend()))


def _forget_delivered_errors() -> None:
  """Drops this thread's JAX runtime tokens of computations that failed with
  an error of ours: the failed computation reported it, and JAX would raise
  it again at `jax.effects_barrier()` and at exit."""
  adapter.forget_failed_runtime_tokens(
      lambda error: "host_callback" in str(error), timeout=1.0)


def _forget_delivered_errors_at_exit() -> None:
  """Registered when this module loads, after JAX's own exit handlers, so
  that it runs before them (atexit runs the last registered first)."""
  if _runtime.errors.ever_delivered():
    _forget_delivered_errors()


def queue_statistics() -> Dict[Tuple[str, Any], QueueStats]:
  """Per-device queue statistics, once a receiver has run."""
  if _runtime.running_receiver() is None:
    return {}
  return {(name, device_by_number(device_id)): queues.stats(device_id)
          for name, queues in transports().items()
          for device_id in queues.device_ids()}


def queues_drained() -> bool:
  """Whether every packet sent so far, to any queue, has been consumed."""
  for transport in transports().values():  # a loop: an idle barrier's cost
    if not transport.drained():
      return False
  return True


def consume_waiting_here(limit: int) -> bool:
  """Runs on the calling thread up to `limit` host functions whose packets
  wait on queues that no receiver thread is busy with, in each device's
  order; returns whether it ran any."""
  return _runtime.consume_here(limit)


def wait_released() -> None:
  """Waits until the queues have released every packet consumed so far."""
  running = _runtime.running_receiver()
  if running is not None:
    running.wait_processed()


def start_receiver() -> None:
  """Starts the receiver's threads now if none runs, as the original did
  when it lowered a computation: one started by the first packet would come
  too late for a computation still running when the program ends (Python
  3.12 starts no thread then)."""
  _runtime.receiver()


def stop_receiver() -> None:
  """Drains and stops the receiver threads."""
  _runtime.stop()


# The barrier that drains at exit: `barrier.barrier_wait`, which `barrier`
# (a module above this one: it binds the primitive) sets when it loads.
_exit_barrier: List[Callable[[str], None]] = []


def set_exit_barrier(barrier_wait: Callable[[str], None]) -> None:
  """`barrier_wait("at_exit")` runs at interpreter exit, before the stop."""
  _exit_barrier[:] = [barrier_wait]


class _Exit:
  """Whether the drain at exit runs (set once, by the main thread)."""
  draining = False


def blocking(call: Callable[[], T]) -> T:
  """`call()`, which may block in C++: while the drain at exit runs, made
  on a thread of its own, so that Ctrl-C ends the wait for it."""
  if not _Exit.draining:
    return call()
  return _runtime.blocking_calls.run(call)


def _drain_at_exit() -> None:
  """Drains the queues. As the original's did, the barrier raises an error
  that no barrier raised yet, and Python prints it ("Exception ignored in
  atexit callback"). Ctrl-C ends the drain: what was left is written to
  stderr, and nothing more is waited for."""
  try:
    _runtime.check_usable()
  except RuntimeError:
    return  # a forked child: nothing of ours to drain
  _Exit.draining, interrupted = True, False
  try:
    for barrier_wait in _exit_barrier:
      barrier_wait("at_exit")
  except KeyboardInterrupt:
    interrupted = True
    sys.stderr.write(_left_undelivered())
    # JAX's exit handlers would wait for them, where Ctrl-C cannot reach.
    adapter.forget_runtime_tokens()
  finally:
    _runtime.shut_down(drain=not interrupted)


def _left_undelivered() -> str:
  """What an interrupted drain at exit says it left: the taps and calls not
  run (or still running) by queue, and the executions of our computations
  still running, one per device (counted with the native library only)."""
  queued = ", ".join(
      f"{count} {'tap or call' if count == 1 else 'taps or calls'} on "
      f"device {device_id} ({name} transport)"
      for (name, device_id), count in _runtime.undelivered().items())
  running = native_library.executions()[1] if native_available() else 0
  return (f"host_callback: Ctrl-C ended the drain at exit; left undelivered: "
          f"{queued or 'nothing queued'}; device executions still running: "
          f"{running}\n")


_runtime = Runtime(_make_transports, settings.queue_bytes,
                   at_exit=_drain_at_exit)
atexit.register(_forget_delivered_errors_at_exit)
