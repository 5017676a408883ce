"""The idle barrier: nothing dispatched since the last barrier that waited
but what is known to have finished, nothing in flight, every queue
drained, nothing to release or raise; then `barrier_wait` costs one native
call (`receiver/native/idle_check.cc`) instead of its probes (`probes`).
Right after a step, that call first waits on the step's outputs, then runs
the taps the step left waiting (the outfeed mode's) on its own thread.

JAX calls a hook after each dispatch through its C++ fast path (see
`_jax_adapter.hook_dispatches`), which the native module counts per thread
and in all (native/dispatches.h); a dispatch through JAX's Python path (a
jitted function's first call) leaves a runtime token instead. A barrier
that waited with the probes covering every device records the counts it
began with, on its thread: while they stay the same, the probes would find
nothing to wait for, as every computation that this thread dispatched has
finished, and on any thread where a computation over several devices may be
pending (once `ordering.multi_device_lowered`, which the probe across two
devices covers). The hook also keeps weak references to two arrays that
each of the thread's last few dispatches output
(native/dispatched_outputs.h): where every dispatch since has an array
alive and ready, those dispatches have finished, and the check counts them
as waited for (a training step that ran inline, whose state the program
keeps). A computation over several devices lowered since (the
first call of one, dispatched through JAX's Python path, which calls no
hook, perhaps on another thread) also makes the next barrier wait. Only on
CPU with the native library built.

The native check also reads what each part watches, configured once (and
again after `reconfigure`): the runtime (retired consumers, a recorded
error, a fork), the thread running host functions, JAX (its runtime
tokens, and whether our hook is still the one JAX calls), the barriers'
given-up executions, what the barrier's listeners act on (the progress
bars still open) and the other transports' queues.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence, Tuple

from .. import _jax_adapter as adapter
from ..host import host_side
from ..primitive import ordering
from ..receiver import transport_native
from ..receiver.consumer_threads import consumer_threads


def _never() -> bool:
  return False


# The most host functions a barrier runs on its own thread at a time (the
# native barrier: the most taps waiting on a queue that it runs): a few
# waiting taps run sooner there than on a receiver thread woken for them; a
# backlog runs faster in that thread's batches.
CONSUMED_HERE = 16

# now(): whether a barrier on this thread would find nothing to wait for,
# release or raise (see the module's docstring): the native check, false
# until a barrier waited after it was configured.
now: Callable[[], bool] = (transport_native.idle_check()
                           if transport_native.available() else _never)
_configured = False


def with_idle_check(wait: Callable[[Optional[str]], None],
                    logs: Callable[[], bool]) -> Callable[..., None]:
  """`wait`, the barrier, as a native function that returns at once, with
  no Python frame, where `now()` holds and `logs()` is false (it would log
  the barrier); `wait` itself where the native module is not built."""
  if not transport_native.available():
    return wait
  return transport_native.idle_barrier(
      wait, logs, f"{wait.__name__}(logging_name=None)\n--\n\n"
      f"{inspect.getdoc(wait)}", wait.__module__)


def begin(in_flight: Any, listeners_idle_when_empty: Sequence[Tuple[Any, str]]
          ) -> None:
  """Before a barrier waits on the probes: hooks JAX's dispatches and notes
  the counts the barrier begins with, unless no idle check can follow it.
  `in_flight`: the barriers' `_InFlight`; `listeners_idle_when_empty`: what
  is empty while the barrier's listeners have nothing to do."""
  global _configured
  if not transport_native.available():
    return
  hook = transport_native.dispatch_hook()
  adapter.hook_dispatches(hook)
  if not adapter.dispatches_hooked(hook):
    return
  if not _configured:
    _configure(in_flight, hook, listeners_idle_when_empty)
    _configured = True
  transport_native.idle_check_begin()


def reconfigure() -> None:
  """What the check watches changed: the next barrier that waits
  configures it anew (and no barrier is idle before)."""
  global _configured
  _configured = False
  if transport_native.available():
    transport_native.idle_check_forget()


def _configure(in_flight: Any, hook: Callable[..., None],
               listeners_idle_when_empty: Sequence[Tuple[Any, str]]) -> None:
  runtime = host_side.runtime
  jax_empty, jax_same = adapter.idle_watches(hook)
  transport_native.configure_idle_check(
      given_up=in_flight.given_up_watch(),
      lowerings=ordering.multi_device_lowerings_watch(),
      empty=(*runtime.idle_watches(), (consumer_threads, "active"),
             *jax_empty, *listeners_idle_when_empty),
      same=jax_same,
      # The Python transport's queues (the native ones are read in C).
      drained=tuple(
          transport.drained_watch()
          for name, transport in runtime.transports().items()
          if name != transport_native.NativeTransport.name),
      array_type=adapter.dispatched_array_type(),
      consumed_here=CONSUMED_HERE)


def waited(covered: bool) -> None:
  """After a barrier waited (after `begin`); `covered`: on the probes of
  every device, so that the next barrier on this thread may be idle."""
  if transport_native.available():
    transport_native.idle_check_waited(covered)
