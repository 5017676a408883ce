"""Eager use of the primitive (no jit): the host function run now on the
calling thread (the synchronous mode, `run_eager`), in the caller
(`run_inline`), or by one compiled op per signature through the receiver,
the host function travelling as a ticket (`eager_ticket`). The primitive's
`impl` (primitive.py) chooses among them.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Optional, Sequence, Tuple

import jax
import numpy as np

from ..host import host_side
from ..host.device_numbers import device_by_number, device_number
from ..host.host_functions import (CallError, CallKind, ConsumerCallParams,
                                   ConsumerTapParams, HostFunction, Transforms,
                                   make_consumer)


# --- Eager ops: one compiled op per signature, the host function chosen at
# run time. The op's host function is `_dispatch`; each execution
# sends, before the operands, a ticket that names the consumer to run. The
# ticket (the runtime's `tickets`) holds the consumer, so the host
# function, until it has run. -------

_failed = threading.local()  # the context of the last consumer that raised


def _dispatch(arrays: Sequence[np.ndarray], device_id: int
              ) -> Optional[Sequence[np.ndarray]]:
  """The consumer of eager ops: runs the one that the ticket names."""
  consumer, context = host_side.runtime.tickets.take(int(arrays[0]))
  try:
    return consumer(arrays[1:], device_id)
  except BaseException:
    _failed.context = context  # read by the registry right after, here
    raise


def _dispatch_context() -> str:
  return getattr(_failed, "context", "")


# The dispatcher is a consumer already, and names its error context itself
# (see host_side.register).
_TAP_DISPATCHER = ConsumerTapParams(func=_dispatch, context=_dispatch_context)


@functools.lru_cache(maxsize=None)
def _call_dispatcher(result_avals: Tuple[Any, ...]) -> ConsumerCallParams:
  return ConsumerCallParams(func=_dispatch, context=_dispatch_context,
                            result_avals=result_avals)


def dispatcher_of(function: HostFunction) -> HostFunction:
  """The host function of the eager ops that run `function`: one per kind
  of op (a tap, or a call with these results)."""
  if isinstance(function, CallKind):
    return _call_dispatcher(function.result_avals)
  return _TAP_DISPATCHER


def is_eager_function(function: HostFunction) -> bool:
  return function.func is _dispatch


def eager_ticket(function: HostFunction, transforms: Transforms) -> int:
  """A ticket for an eager op to run `function` under `transforms` with."""
  return host_side.runtime.tickets.issue(
      make_consumer(function, transforms, device_by_number),
      host_side.context_of(function))


def run_eager(function: HostFunction, transforms: Transforms,
              arrays: Sequence[np.ndarray], device: Any) -> Any:
  """Runs `function` now, on the calling thread, if `device` has no packet
  waiting (else returns NotImplemented): the synchronous mode's eager taps
  and calls, whose arguments are ready. As a request run on the device
  thread: an error is recorded for barrier_wait and raised as the device's
  error."""
  number = device_number(device)
  if not host_side.runtime.idle(number):
    return NotImplemented  # the eager op queues behind those packets
  consumer = make_consumer(function, transforms, device_by_number)
  try:
    return host_side.runtime.runner.run_here(
        consumer, host_side.context_of(function), number, list(arrays))
  except Exception as error:  # pylint: disable=broad-except
    # What the compiled op's caller gets: JAX's error for a failed
    # computation, with the device's message, chained to the cause.
    raised = jax.errors.JaxRuntimeError(f"INTERNAL: {error}")
    raise raised from (error.__cause__ or error)


def drop_ticket(ticket: int) -> None:
  """Forgets a ticket whose op failed before its host function ran."""
  host_side.runtime.tickets.drop(ticket)


def run_inline(function: HostFunction, transforms: Transforms,
               arrays: Sequence[np.ndarray], device: Any) -> Any:
  """Runs a host function in the caller's thread (inline mode).

  As in the original, what the host function raises reaches the caller as
  itself (a `call`'s context is added as a note), and not `barrier_wait`.
  """
  consumer = host_side.runtime.registry.get(
      host_side.register(function, transforms))
  try:
    return consumer(arrays, device_number(device))
  except CallError as error:
    if error.__cause__ is None:  # a result that does not match result_shape
      raise
    error.__cause__.add_note(str(error))
    raise error.__cause__ from None


