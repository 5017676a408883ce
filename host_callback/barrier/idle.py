"""The idle barrier's check: nothing dispatched since the last barrier that
waited, nothing in flight, every queue drained; then `barrier_wait` costs a
few reads instead of its probes (`probes`).

JAX calls a hook after each dispatch through its C++ fast path (see
`_jax_adapter.hook_dispatches`), which the native module counts per thread
and in all (native/dispatches.h); a dispatch through JAX's Python path (a
jitted function's first call) leaves a runtime token instead. A barrier
that waited with the probes covering every device records the counts it
began with, on its thread: while they stay the same, the probes would find
nothing to wait for, as every computation that this thread dispatched has
finished, and on any thread where a computation over several devices may be
pending (once `ordering.multi_device_lowered`, which the probe across two
devices covers). A computation over several devices lowered since (the
first call of one, dispatched through JAX's Python path, which calls no
hook, perhaps on another thread) also makes the next barrier wait. Only on
CPU with the native library built.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple, Optional, Tuple

from .. import _jax_adapter as adapter
from ..host import host_side
from ..primitive import ordering
from ..receiver import transport_native


class Began(NamedTuple):
  """What a barrier that waits began with: the dispatches noted on its
  thread and on all, the computations over several devices lowered, the
  hook that counts; and, bound once, the native check of the counts and
  of the native queues (`transport_native.settled_check`) and whether the
  other transports' queues are drained."""
  on_this_thread: int
  on_all: int
  multi_device_lowerings: int
  hook: Callable[..., None]
  settled: Callable[[int, int, int], bool]
  others_drained: Tuple[Callable[[], bool], ...]

# What this thread's last barrier that waited on the probes of every device
# began with.
_last = threading.local()


def begin() -> Optional[Began]:
  """Before a barrier waits: hooks JAX's dispatches, and returns what to
  record if the probes cover every device (None: no idle check)."""
  if not transport_native.available():
    return None
  hook = transport_native.dispatch_hook()
  adapter.hook_dispatches(hook)
  if not adapter.dispatches_hooked(hook):
    return None
  on_this_thread, on_all = transport_native.dispatches()
  others_drained = tuple(
      transport.drained
      for name, transport in host_side.runtime.transports().items()
      if name != transport_native.NativeTransport.name)
  return Began(on_this_thread, on_all, ordering.multi_device_lowerings(),
               hook, transport_native.settled_check(), others_drained)


def waited(began: Optional[Began]) -> None:
  """After a barrier that `began` so waited on the probes of every
  device."""
  _last.began = began


def idle(given_up: int) -> bool:
  """Whether a barrier would find nothing to wait for: see the module's
  docstring; `given_up`: the executions in flight that barriers gave up
  on."""
  began: Optional[Began] = getattr(_last, "began", None)
  if began is None:
    return False
  lowerings = ordering.multi_device_lowerings()
  if lowerings != began.multi_device_lowerings:
    return False
  on_all = began.on_all if lowerings else -1
  if not (began.settled(began.on_this_thread, on_all, given_up)
          and not adapter.runtime_tokens_pending()
          and adapter.dispatches_hooked(began.hook)):
    return False
  for drained in began.others_drained:
    if not drained():
      return False
  return True
