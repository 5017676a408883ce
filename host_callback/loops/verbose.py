"""`verbose`: a function that runs like `f` and reports every step of the
loops in it."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional, Sequence

from .delivery import Observer, Observers
from .emission import Emitter, Sink
from .events import TapEvent
from .primitive_taps import PrimitiveTap
from .walker import Filters, Walker

# The `ops` names a user may give, and the loop primitive each means.
_OPS = {"scan": "scan", "while_loop": "while", "while": "while"}


def filters(ops: Sequence[str], where: Optional[Callable[[str], bool]],
            max_depth: Optional[int]) -> Filters:
  return Filters(frozenset(_OPS[op] for op in ops if op in _OPS), where,
                 max_depth)


def check_options(sample_every: int, select_ys: Any,
                  ops: Sequence[str]) -> None:
  """Rejects a `sample_every` below 1; warns of a `select_ys` that cannot
  apply."""
  if sample_every < 1:
    raise ValueError(f"sample_every must be >= 1, got {sample_every}")
  if select_ys is not None and "scan" not in ops:
    warnings.warn(
        'host_callback.loops: select_ys has no effect when ops does not '
        'include "scan" (a while_loop has no per-step outputs). Remove '
        'select_ys or add "scan" to ops.', UserWarning, stacklevel=3)


def instrumented(f: Callable[..., Any], sink: Sink, *,
                 select: Optional[Callable[..., Any]],
                 select_ys: Optional[Callable[..., Any]], sample_every: int,
                 loop_filters: Filters, taps: Sequence[PrimitiveTap],
                 partitioned: bool = False,
                 first_index: int = 0) -> Callable[..., Any]:
  """`f` with its loops and `taps` reporting to `sink`."""
  walker = Walker(Emitter(sink, select, select_ys, sample_every, partitioned),
                  loop_filters, tuple(taps))

  @functools.wraps(f)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    if kwargs:
      raise TypeError(
          "host_callback.loops.verbose: the function takes positional "
          "arguments only; bind keyword ones first, e.g. with "
          "functools.partial(f, **kwargs)")
    return walker.run(f, args, first_index)
  return wrapped


def verbose(f: Callable[..., Any], *,
            on_step: Optional[Observer] = None,
            select: Optional[Callable[..., Any]] = None,
            alert: Optional[Callable[[TapEvent], Any]] = None,
            alert_once: bool = False,
            on_ys: Optional[Observer] = None,
            select_ys: Optional[Callable[..., Any]] = None,
            alert_ys: Optional[Callable[[TapEvent], Any]] = None,
            alert_ys_once: bool = False,
            ops: Sequence[str] = ("scan", "while_loop"),
            sample_every: int = 1,
            where: Optional[Callable[[str], bool]] = None,
            max_depth: Optional[int] = None,
            taps: Sequence[PrimitiveTap] = (),
            partitioned: bool = False) -> Callable[..., Any]:
  """`f`, returning the same values (and gradients), with every step of its
  `lax.scan` and `lax.while_loop` loops reported to `on_step` as a
  `TapEvent`.

  Args:
    f: the function, unmodified; it takes positional arguments.
    on_step: called on the host with each carry and primitive event.
    select: reduces a step's carry on the device before it is sent: it
      gets the tuple of the carry's leaves (and may take the loop's `path`
      as a second argument) and returns any pytree. Default: all leaves.
    alert: a host predicate on each carry event; when truthy, a line
      `[tap] FAIL {path} {step}/{total}: {message}` goes to stderr (the
      result when a str, else "alert"). It runs before `on_step`.
    alert_once: alert at most once per loop address.
    on_ys, select_ys, alert_ys, alert_ys_once: the same for each step's
      outputs of a scan (events of kind "output").
    ops: the loops that report their carry: "scan", "while_loop".
    sample_every: report steps 0, k, 2k, ... only; the others send nothing.
    where: report only the loops whose path it accepts.
    max_depth: report only loops whose path has at most this many "/".
    taps: primitive taps (`on`, `watch_nan`, `print`); they fire in every
      loop, whatever `ops`, `where` and `max_depth` say.
    partitioned: under a sharded `jit`, each device reports its own shard
      of what `select` returned, as `id_tap(..., partitioned=True)` sends
      it (an extension: jax-tap has no such option). Without it one
      device reports the whole value.

  The events of a call have been delivered when it returns, in the
  synchronous mode (the CPU default), after `host_callback.barrier_wait()`
  in the outfeed mode. A callback or alert that raises warns once and
  never changes the program.
  """
  check_options(sample_every, select_ys, ops)
  sink = Observers.of(on_step, alert, alert_once, on_ys, alert_ys,
                      alert_ys_once)
  return instrumented(f, sink, select=select, select_ys=select_ys,
                      sample_every=sample_every,
                      loop_filters=filters(ops, where, max_depth), taps=taps,
                      partitioned=partitioned)
