"""Timing helpers: how long a jitted function takes until its callbacks
ran, medians of several runs or of runs that take turns, and `compare`,
which times one scenario for host_callback on each transport and for each
baseline."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import (Any, Callable, ContextManager, Dict, List, Optional,
                    Sequence, Tuple)

import jax
import jax.numpy as jnp

import host_callback as hcb

from . import ways

Values = Dict[str, float]  # {implementation: value}


def drain() -> None:
  hcb.barrier_wait()
  jax.effects_barrier()


def median_of(run: Callable[[], Tuple[float, ...]], repeat: int
              ) -> Tuple[float, ...]:
  """Each column's median over `repeat` runs, after a run that compiles."""
  run()  # compile and warm up
  samples = [run() for _ in range(repeat)]
  return tuple(statistics.median(column) for column in zip(*samples))


def _scan(step_op: Callable, steps: int) -> Callable:
  def body(carry, _):
    return step_op(carry) + 1, None
  return jax.jit(lambda x: jax.lax.scan(body, x, None, length=steps)[0])


def scan_times(step_op: Callable, steps: int, x, repeat: int
               ) -> Tuple[float, ...]:
  """Seconds per step until the result is ready and until drained."""
  f = _scan(step_op, steps)

  def run():
    start = time.perf_counter()
    jax.block_until_ready(f(x))
    ready = time.perf_counter()
    drain()
    drained = time.perf_counter()
    return (ready - start) / steps, (drained - start) / steps
  return median_of(run, repeat)


def over_bare_scan(step_ops: Dict[str, Callable], steps: int, turns: int,
                   input_of: Optional[Callable[[], Any]] = None) -> Values:
  """µs that each of `step_ops` adds to a step of a `steps`-step scan of
  `x + 1`, its runs (until drained) taking turns (`in_turns`) with the
  bare scan's; and the bare scan's µs per step, as "bare scan". Each run
  starts from `input_of()`, made in its time (default: a ready 0)."""
  if input_of is None:
    zero = jnp.float32(0)
    input_of = lambda: zero  # noqa: E731
  times = in_turns({name: _until_drained(_scan(op, steps), input_of)
                    for name, op in {"bare scan": lambda v: v,
                                     **step_ops}.items()}, turns)
  bare = times.pop("bare scan")
  values = {name: 1e6 * (seconds - bare) / steps
            for name, seconds in times.items()}
  values["bare scan"] = 1e6 * bare / steps
  return values


def behind_a_running_computation(step_op: Callable, steps: int, turns: int
                                 ) -> float:
  """µs that `step_op` adds to each step of a `steps`-step scan dispatched
  while a computation before it still runs (`over_bare_scan`): its input
  is that computation's output, so XLA runs the scan on one of its own
  threads rather than the caller's, as in a loop that does not wait for
  each step."""
  weights = jnp.full((256, 256), 1e-3, jnp.float32)
  before = jax.jit(lambda w: jax.lax.fori_loop(
      0, 20, lambda i, z: jnp.tanh(z @ z), w))
  return over_bare_scan({"op": step_op}, steps, turns,
                        input_of=lambda: before(weights)[0, 0] * 0)["op"]


def slow_consumer_times(step_op: Callable, steps: int, repeat: int
                        ) -> Tuple[float, ...]:
  """Seconds for the jitted call to return, to be ready, and to drain."""
  f = _scan(step_op, steps)

  def run():
    start = time.perf_counter()
    out = f(jnp.float32(0))
    returned = time.perf_counter()
    jax.block_until_ready(out)
    ready = time.perf_counter()
    drain()
    drained = time.perf_counter()
    return returned - start, ready - start, drained - start
  return median_of(run, repeat)


def _until_drained(f: Callable, input_of: Callable[[], Any]
                   ) -> Callable[[], float]:
  """`run()`: seconds for `f(input_of())` until ready and its callbacks
  drained."""
  def run() -> float:
    start = time.perf_counter()
    jax.block_until_ready(f(input_of()))
    drain()
    return time.perf_counter() - start
  return run


def one_shot_run(op: Callable, x) -> Callable[[], float]:
  """`run()`: seconds for jitted `op(x)` until ready and its callbacks
  drained."""
  return _until_drained(jax.jit(op), lambda: x)


def one_shot_time(op: Callable, x, repeat: int) -> float:
  run = one_shot_run(op, x)
  return median_of(lambda: (run(),), repeat)[0]


def step_run(op: Callable, calls: int = 2000) -> Callable[[], float]:
  """`run()`: seconds per call of a jitted training-like step (a 16x16
  matmul and a sum, then `op`) called `calls` times from a Python loop,
  until its callbacks drained."""
  weights = jnp.ones((16, 16), jnp.float32)
  step = jax.jit(lambda x: op(jnp.sum(x @ weights)))
  x = jnp.ones((16, 16), jnp.float32)

  def run() -> float:
    start = time.perf_counter()
    for _ in range(calls):
      out = step(x)
    jax.block_until_ready(out)
    drain()
    return (time.perf_counter() - start) / calls
  return run


def step_time(op: Callable, repeat: int) -> float:
  """`step_run(op)`'s median over `repeat` runs."""
  run = step_run(op)
  return median_of(lambda: (run(),), repeat)[0]


def in_turns(runs: Dict[str, Callable[[], float]], turns: int) -> Values:
  """The median of each of `runs` (each returns its seconds) over `turns`
  turns, after a warm-up of each. They take turns, so that the machine's
  drift (large on a small VM) reaches all of them alike."""
  for run in runs.values():
    run()
  times: Dict[str, List[float]] = {name: [] for name in runs}
  for _ in range(turns):
    for name, run in runs.items():
      times[name].append(run())
  return {name: statistics.median(t) for name, t in times.items()}


def with_transport(name: str, measure: Callable[[], Any]) -> Any:
  jax.config.update("jax_host_callback_transport", name)
  try:
    return measure()
  finally:
    jax.config.update("jax_host_callback_transport", "auto")


def in_mode(synchronous: bool, measure: Callable[[], Any]
            ) -> Callable[[], Any]:
  """`measure`, run in the synchronous mode (the CPU default) where asked,
  else as it is (in the outfeed mode, the rows' default)."""
  if not synchronous:
    return measure

  def run() -> Any:
    jax.config.update("jax_host_callback_outfeed", False)
    try:
      return measure()
    finally:
      jax.config.update("jax_host_callback_outfeed", True)
  return run


Measure = Callable[[Sequence[str]], Values]  # transports -> values


def compare(ours: Callable[[Callable], float], baselines: Dict[str, Callable],
            factory: Callable, synchronous: bool = False) -> Measure:
  """Measures `ours(factory)` on each transport, as `hcb[transport]`, and
  `ours(baseline)` for each baseline, in the synchronous mode or the
  outfeed one."""
  def measure(transports: Sequence[str]) -> Values:
    measure_ours = in_mode(synchronous, lambda: ours(factory))
    values = {f"hcb[{t}]": with_transport(t, measure_ours)
              for t in transports}
    for name, baseline in baselines.items():
      values[name] = in_mode(synchronous,
                             lambda baseline=baseline: ours(baseline))()
    return values
  return measure


def compare_in_turns(run_of: Callable[[Callable], Callable[[], float]],
                     baselines: Dict[str, Callable], factory: Callable,
                     turns: int, synchronous: bool = False,
                     confined: Callable[[], ContextManager[Any]] = (
                         contextlib.nullcontext)) -> Measure:
  """As `compare`, in ms, for runs (in seconds) of `run_of(factory)` and
  `run_of(baseline)` that take turns (`in_turns`) on each transport,
  inside the context `confined()` makes; a baseline's column shows its
  runs beside the last transport's (the native one, where built)."""
  def measure(transports: Sequence[str]) -> Values:
    values: Values = {}
    for transport in transports:
      def one() -> float:
        with confined():
          times = in_turns({"ours": run_of(factory),
                            **{name: run_of(b)
                               for name, b in baselines.items()}}, turns)
        ours = times.pop("ours")
        values.update(times)  # beside the last transport's, in the end
        return ours
      values[f"hcb[{transport}]"] = with_transport(
          transport, in_mode(synchronous, one))
    return {name: 1e3 * seconds for name, seconds in values.items()}
  return measure


# --- Progress bars and lenses on a scan --------------------------------------

def bar_scan_time(make: Callable, steps: int, print_rate: Optional[int],
                  repeat: int) -> float:
  """Seconds for a `steps`-step scan of a 16x16 matmul with the bar that
  `make` gives, until its callbacks drained."""
  weights = jnp.eye(16, dtype=jnp.float32) * 0.5

  @make(steps, print_rate)
  def body(carry, i):
    return jnp.tanh(carry @ weights + i), None
  f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(steps))[0])
  x = jnp.ones((16, 16), jnp.float32)

  def run():
    start = time.perf_counter()
    jax.block_until_ready(f(x))
    drain()
    return (time.perf_counter() - start,)
  return median_of(run, repeat)[0]


def per_update(make: Callable, steps: int, repeat: int) -> float:
  """Microseconds that each update of a bar with `print_rate=1` adds."""
  with_bar = bar_scan_time(make, steps, 1, repeat)
  return 1e6 * (with_bar - bar_scan_time(ways.no_bar, steps, 1, repeat)) / steps


def lens_scan_run(make: Callable, steps: int, sample_every: int,
                  size: int) -> Callable[[], float]:
  """`run()`: seconds for a jitted `steps`-step scan whose step is a
  `size`x`size` matmul (a scalar add where `size` is 0), with the lens
  `make` gives, until its events were delivered."""
  def scan(operands):  # the weights an argument, not a constant, for both
    x, weights = operands
    def body(carry, _):
      return (jnp.tanh(carry @ weights) if size else carry + 1.0), None
    return jax.lax.scan(body, x, None, length=steps)[0]
  x = jnp.ones((size, size), jnp.float32) if size else jnp.float32(0)
  weights = jnp.eye(max(size, 1), dtype=jnp.float32) * 0.5
  return one_shot_run(make(scan, sample_every), (x, weights))


def per_event(make: Callable, steps: int, repeat: int) -> float:
  """Microseconds that each event of a lens with a scalar `select` adds to
  a trivial scan step: the scans with and without the lens take turns
  (`in_turns`), 4 * `repeat` each."""
  times = in_turns({"lens": lens_scan_run(make, steps, 1, 0),
                    "none": lens_scan_run(ways.no_lens, steps, 1, 0)},
                   4 * repeat)
  return 1e6 * (times["lens"] - times["none"]) / steps
