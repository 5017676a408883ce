"""The host side as the JAX side uses it: the process's transports and its
receiver's lifecycle (`runtime`, a `receiver.Runtime`), the registration of
host functions (consumers) and of sites, the queues' state for barriers,
start, stop and the drain at exit. Eager use is in eager.py."""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import weakref
from typing import (Any, Callable, Dict, Optional, Sequence, Tuple,
                    TypeVar, Union)

import jax
import jaxlib
import numpy as np

from .. import _jax_adapter as adapter
from .. import settings
from . import transport_policy
from .device_numbers import device_by_number
from .host_functions import (BuffersCallParams, CallKind, ConsumerKind,
                             HostFunction, Transforms, int_operands,
                             make_consumer, result_avals)
from ..receiver import Consumer, PythonTransport, QueueStats, Runtime, Transport
from ..receiver import native_wire, transport_native
from ..receiver import ctrl_c
from ..receiver.transport import int32_scalar

T = TypeVar("T")


def _make_transports() -> Dict[str, Transport]:
  transports: Dict[str, Transport] = {"python": PythonTransport()}
  if transport_policy.native_on_cpu():
    transports["native"] = transport_native.NativeTransport()
  return transports


def transport(name: str) -> Transport:
  """The process's transport called `name` ('native' or 'python')."""
  return runtime.transports()[name]


@dataclasses.dataclass
class _Registrations:
  """What the receiver holds for one live host function: a consumer per
  `transforms` (and the transports' sites of those consumers)."""
  consumer_ids: Dict[Transforms, int] = dataclasses.field(default_factory=dict)


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
  runtime.retire(list(registrations.consumer_ids.values()))


def open_device(producer: Transport, device_id: int) -> None:
  """Opens the queue of a device that may send to `producer`."""
  runtime.open_device(producer.name, device_id)


def context_of(function: HostFunction) -> str:
  """What names `function` in the error of a device that waited for it
  (a call's own errors name it)."""
  return ("" if isinstance(function, CallKind) else
          f"host_callback.id_tap: the tap function {function.name}")


def register(function: HostFunction, transforms: Transforms) -> int:
  """The consumer id for `function` under `transforms`."""
  runtime.release_retired()
  with _registrations_lock:
    registrations = _registrations_of(function)
    consumer_id = registrations.consumer_ids.get(transforms)
    if consumer_id is None:
      consumer: Consumer
      context: Union[str, Callable[[], str]]
      if isinstance(function, ConsumerKind):
        # A host function that is a consumer already, and names the error
        # context itself: the eager ops' dispatcher (eager.py), a loop tap
        # (loops/emission.py). The consumer holds `function.func` only.
        consumer = make_consumer(function, transforms, device_by_number)
        context = function.context
      else:
        context = context_of(function)
        # The consumer holds a copy: the receiver must not keep `function`
        # alive, or it would never be retired.
        consumer = make_consumer(dataclasses.replace(function), transforms,
                                 device_by_number)
      consumer_id = registrations.consumer_ids[transforms] = (
          runtime.registry.add(consumer, context))
    return consumer_id


def register_site(producer: Transport, function: HostFunction,
                  transforms: Transforms, dtypes: Sequence[np.dtype],
                  shapes: Sequence[Tuple[int, ...]]) -> int:
  """A site of `producer` for `function` under `transforms`."""
  return producer.register_site(
      register(function, transforms), dtypes, shapes, name=function.name,
      copy=function.copy, buffers=isinstance(function, BuffersCallParams),
      packed_results=any(
          native_wire.packed_bits(np.dtype(a.dtype)) is not None
          for a in result_avals(function)),
      int_columns=[i for i in int_operands(function)
                   if int32_scalar(dtypes[i], shapes[i])])


def raise_recorded_error() -> None:
  """Raises `CallbackException` for the last host function error, if any.

  In the synchronous mode, as in the original's, an error that failed the
  computation waiting for it (its caller got it) is not raised again; in
  the outfeed mode a `call`'s error is, as the original's was.
  """
  errors = runtime.errors
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
  if runtime.errors.ever_delivered():
    _forget_delivered_errors()


def queue_statistics() -> Dict[Tuple[str, Any], QueueStats]:
  """Per-device queue statistics, once a receiver has run."""
  if runtime.running_receiver() is None:
    return {}
  return {(name, device_by_number(device_id)): queues.stats(device_id)
          for name, queues in runtime.transports().items()
          for device_id in queues.device_ids()}


def queues_drained() -> bool:
  """Whether every packet sent so far, to any queue, has been consumed."""
  for transport in runtime.transports().values():
    if not transport.drained():
      return False
  return True


def wait_released() -> None:
  """Waits until the queues have released every packet consumed so far."""
  running = runtime.running_receiver()
  if running is not None:
    running.wait_processed()


def start_receiver() -> None:
  """Starts the receiver's threads now if none runs, as the original did
  when it lowered a computation: one started by the first packet would come
  too late for a computation still running when the program ends (Python
  3.12 starts no thread then)."""
  runtime.receiver()


class _Exit:
  """The drain at exit: the barrier it runs (`barrier.barrier_wait`, which
  `barrier`, a part above this one, registers when it loads), and whether
  it runs (set once, by the main thread)."""
  barrier: Optional[Callable[[str], None]] = None
  draining = False


def set_exit_barrier(barrier_wait: Callable[[str], None]) -> None:
  """`barrier_wait("at_exit")` runs at interpreter exit, before the stop."""
  _Exit.barrier = barrier_wait


def blocking(call: Callable[[], T]) -> T:
  """`call()`, which may block in C++: while the drain at exit runs, made
  on a thread of its own, so that Ctrl-C ends the wait for it."""
  if not _Exit.draining:
    return call()
  return runtime.blocking_calls.run(call)


def _drain_at_exit() -> None:
  """Drains the queues. As the original's did, the barrier raises an error
  that no barrier raised yet, and Python prints it ("Exception ignored in
  atexit callback"). After Ctrl-C, one that ended the program or one that
  ends the drain, no host function runs or is waited for: what was left
  is written to stderr and the process ends at once (`_abandon`)."""
  try:
    runtime.check_usable()
  except RuntimeError:
    return  # a forked child: nothing of ours to drain
  interrupted = ctrl_c.program_ended_by_ctrl_c()
  try:
    if interrupted:
      _abandon("Ctrl-C ended the program")
    else:
      _Exit.draining = True
      try:
        if _Exit.barrier is not None:
          _Exit.barrier("at_exit")
      except KeyboardInterrupt:
        interrupted = True
        _abandon("Ctrl-C ended the drain at exit")
  finally:
    runtime.shut_down(drain=not interrupted)
  ctrl_c.end_as_ctrl_c_would()


def _abandon(why: str) -> None:
  """Ends the process at once, saying what was left, when a host function
  runs or was dropped, or a computation of ours runs (`Runtime.abandon`);
  otherwise returns, and the stop waits for nothing."""
  runtime.abandon(why, _executions_running)
  # JAX's exit handlers would wait for them, where Ctrl-C cannot reach.
  adapter.forget_runtime_tokens()


def _executions_running() -> Optional[int]:
  """The executions of our computations still running, one per device;
  None where they are not counted (without the native library)."""
  return (transport_native.executions()[1]
          if transport_policy.native_on_cpu() else None)


def _report_ctrl_c_as_such() -> None:
  """Once a computation of ours may run: a computation that Ctrl-C
  cancelled and that nothing caught is reported as the KeyboardInterrupt
  it was, without the frames of JAX and of this package
  (`receiver/ctrl_c.py:install_excepthook`)."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  ctrl_c.install_excepthook(
      [package, os.path.dirname(os.path.abspath(ctrl_c.__file__))] +
      [os.path.dirname(module.__file__) for module in (jax, jaxlib)],
      _ctrl_c_in_jax_callback)


def _ctrl_c_in_jax_callback(error: BaseException) -> bool:
  """Whether `error` is JAX's for a Python callback (the Python transport's)
  that a SIGINT stopped in JAX's own frames, before or after ours ran: its
  text ends with the KeyboardInterrupt's traceback, with no message. Its
  execution is then counted as ended, as our callback counts one that it
  stops (`executions.failed`), so that the exit does not report it as
  still running."""
  text = str(error).rstrip()
  stopped = ("CpuCallback error" in text and
             text.splitlines()[-1].rstrip(": ") == "KeyboardInterrupt")
  if (stopped and transport_policy.native_on_cpu() and
      transport_native.executions()[1] > 0):
    transport_native.execution_failed()
  return stopped


runtime = Runtime(_make_transports, settings.queue_bytes,
                   at_exit=_drain_at_exit, at_first_use=_report_ctrl_c_as_such)
atexit.register(_forget_delivered_errors_at_exit)
