"""`verbose`: a function that runs like `f` and reports every step of the
loops in it."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

from .delivery import Observer
from .emission import Emitter, Sink
from .events import TapEvent
from .options import DEFAULTS, LensOptions
from .primitive_taps import PrimitiveTap
from .walker import Walker


def instrumented(f: Callable[..., Any], sink: Sink, options: LensOptions,
                 first_index: int = 0) -> Callable[..., Any]:
  """`f` with its loops and `options.taps` reporting to `sink`."""
  walker = Walker(Emitter(sink, options.select, options.select_ys,
                          options.sample_every, options.partitioned),
                  options.filters(), options.taps)

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
            on_step: Optional[Observer] = DEFAULTS.on_step,
            select: Optional[Callable[..., Any]] = DEFAULTS.select,
            alert: Optional[Callable[[TapEvent], Any]] = DEFAULTS.alert,
            alert_once: bool = DEFAULTS.alert_once,
            on_ys: Optional[Observer] = DEFAULTS.on_ys,
            select_ys: Optional[Callable[..., Any]] = DEFAULTS.select_ys,
            alert_ys: Optional[Callable[[TapEvent], Any]] = DEFAULTS.alert_ys,
            alert_ys_once: bool = DEFAULTS.alert_ys_once,
            ops: Sequence[str] = DEFAULTS.ops,
            sample_every: int = DEFAULTS.sample_every,
            where: Optional[Callable[[str], bool]] = DEFAULTS.where,
            max_depth: Optional[int] = DEFAULTS.max_depth,
            taps: Sequence[PrimitiveTap] = DEFAULTS.taps,
            partitioned: bool = DEFAULTS.partitioned) -> Callable[..., Any]:
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
  options = LensOptions.of(locals())  # the arguments but `f`
  options.check()
  return instrumented(f, options.observers(), options)
