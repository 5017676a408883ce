"""Benchmarks of host_callback against JAX's own callbacks, in the same run.

    python -m tools.bench                 # print the table
    python -m tools.bench --write docs    # also write docs/benchmarks.md
    python -m tools.bench --quick         # smaller sizes, for a smoke test
    python -m tools.bench --only "MiB"    # only the rows whose name matches

Rows run in the outfeed mode (asynchronous taps) unless they say
"synchronous" (the CPU default). Each row times one scenario for
host_callback on every available transport and
for `jax.debug.callback`, `jax.experimental.io_callback(ordered=True)` and, for
calls, `jax.pure_callback`; ratios are `baseline time / host_callback time`
(above 1: host_callback is faster). Times are the median of `--repeat` runs
after a warm-up run that compiles.

The progress-bar rows time `host_callback.tqdm.scan_tqdm` and jax-tqdm 0.4's
(its column is empty, with a note, where jax-tqdm is not installed) on a
20k-step scan of a 16x16 matmul: the cost of each bar update with
`print_rate=1`, and the whole scan with the default rate (every n/20 steps)
beside the same scan without a bar.

The loop rows time `host_callback.loops.verbose` and jax-tap's (its column
is empty, with a note, where jax-tap is not installed): what an event with a
scalar `select` (the carry's mean) adds to each step of a 20k-step trivial
scan, and a 2k-step scan of a 64x64 matmul with `sample_every=100` beside
the same scan without a lens and with jax-tap's, run in turns (100 x
`--repeat` of each; the medians), since the VM's drift between long runs
is larger than the difference; that row twice, as the process runs and
with all its threads on one core (`_on_one_core`, on Linux).

The large-array rows also time `jit(lambda x: x + 1)` on the same array, one
pass over the data: the yardstick for a tap (one copy) and a call. The
`buffers=True` row (an identity that fills `out=`) is beside `call` without
`buffers` and `jax.experimental.buffer_callback` (no column where the
installed JAX lacks it). Their
taps return one element of the array, not the array: a jitted function that
returns its argument makes XLA copy it into a new output buffer, which would
time XLA rather than the callback. The "size sweep" rows time an outfeed tap
of 4 bytes to 1 GiB on each transport.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import platform
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

# Four CPU devices, for the barrier rows; every other row uses device 0.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback import loops  # noqa: E402
from host_callback.host import transport_policy  # noqa: E402
from host_callback.tqdm import scan_tqdm  # noqa: E402
from tools import bench_barrier  # noqa: E402


def _noop(*args, **kwargs) -> None:
  return None


def _on_step(event: Any) -> None:
  """A lens's callback as users write one: a function of the event (no
  `**kwargs`, whose dict would cost each event an allocation)."""
  del event


def _sleep_1ms(*args, **kwargs) -> None:
  time.sleep(0.001)


# --- The ways of tapping and calling being compared --------------------------

def _tap_hcb(func: Callable, copy: bool = True) -> Callable:
  return lambda x: hcb.id_tap(lambda arg, transforms: func(arg), x, copy=copy)


def _tap_debug(func: Callable) -> Callable:
  def tap(x):
    jax.debug.callback(func, x)
    return x
  return tap


def _tap_io(func: Callable) -> Callable:
  def tap(x):
    io_callback(lambda a: func(a), None, x, ordered=True)
    return x
  return tap


def _first(tap: Callable) -> Callable:
  """`tap`, returning one element: no output copy of the tapped array."""
  return lambda x: tap(x).ravel()[0]


def _tap_hcb_partitioned(func: Callable) -> Callable:
  return lambda x: hcb.id_tap(lambda arg, transforms: func(arg), x,
                              partitioned=True)


def _tap_debug_partitioned(func: Callable) -> Callable:
  def tap(x):
    jax.debug.callback(func, x, partitioned=True)
    return x
  return tap


def _first_of_rows(tap: Callable) -> Callable:
  """`tap`, returning the first element of each row of a value sharded by
  rows: no output copy, and nothing gathered."""
  return lambda x: tap(x)[:, 0, 0]


def _call_hcb(func: Callable, copy: bool = True) -> Callable:
  return lambda x: hcb.call(func, x, result_shape=x, copy=copy)


def _call_hcb_filling(func: Callable) -> Callable:
  """A `buffers=True` call of `func(a, out)`, which fills `out` in place."""
  return lambda x: hcb.call(func, x, result_shape=x, buffers=True)


def _copy_into(a, out) -> None:
  """The identity as a host function that fills `out`."""
  np.copyto(out, a)


def _buffer_callbacks() -> Dict[str, Callable]:
  """`jax.experimental.buffer_callback` filling its output, where the
  installed JAX has it."""
  try:
    from jax.experimental.buffer_callback import buffer_callback
  except ImportError:
    return {}

  def identity(func: Callable) -> Callable:
    del func
    fill = lambda ctx, out, a: _copy_into(np.asarray(a), np.asarray(out))  # noqa: E731
    return lambda x: buffer_callback(
        fill, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  return {"buffer_callback": identity}


def _call_pure(func: Callable) -> Callable:
  return lambda x: jax.pure_callback(func, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _call_io(func: Callable) -> Callable:
  return lambda x: io_callback(func, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                               ordered=True)


def _nothing(func: Callable) -> Callable:
  del func
  return lambda x: x


def _plus_one(func: Callable) -> Callable:
  del func
  return lambda x: x + 1


TAPPERS = {"debug.callback": _tap_debug, "io_callback": _tap_io}
CALLERS = {"pure_callback": _call_pure, "io_callback": _call_io}
NOTHING = {"no callback": _nothing}
# The yardstick of the large-array rows: one pass over the same array.
YARDSTICK = {"jit(x+1)": _plus_one}


# --- Measurements --------------------------------------------------------------

def _scan(step_op: Callable, steps: int) -> Callable:
  def body(carry, _):
    return step_op(carry) + 1, None
  return jax.jit(lambda x: jax.lax.scan(body, x, None, length=steps)[0])


def _drain() -> None:
  hcb.barrier_wait()
  jax.effects_barrier()


def _time(run: Callable[[], Tuple[float, ...]], repeat: int) -> Tuple[float, ...]:
  run()  # compile and warm up
  samples = [run() for _ in range(repeat)]
  return tuple(statistics.median(column) for column in zip(*samples))


def _scan_times(step_op: Callable, steps: int, x, repeat: int) -> Tuple[float, float]:
  """Seconds per step until the result is ready and until drained."""
  f = _scan(step_op, steps)

  def run():
    start = time.perf_counter()
    jax.block_until_ready(f(x))
    ready = time.perf_counter()
    _drain()
    drained = time.perf_counter()
    return (ready - start) / steps, (drained - start) / steps
  return _time(run, repeat)


def _slow_consumer_times(step_op: Callable, steps: int, repeat: int
                         ) -> Tuple[float, float, float]:
  """Seconds for the jitted call to return, to be ready, and to drain."""
  f = _scan(step_op, steps)

  def run():
    start = time.perf_counter()
    out = f(jnp.float32(0))
    returned = time.perf_counter()
    jax.block_until_ready(out)
    ready = time.perf_counter()
    _drain()
    drained = time.perf_counter()
    return returned - start, ready - start, drained - start
  return _time(run, repeat)


def _one_shot_run(op: Callable, x) -> Callable[[], float]:
  """`run()`: seconds for jitted `op(x)` until ready and its callbacks
  drained."""
  f = jax.jit(op)

  def run() -> float:
    start = time.perf_counter()
    jax.block_until_ready(f(x))
    _drain()
    return time.perf_counter() - start
  return run


def _one_shot_times(op: Callable, x, repeat: int) -> Tuple[float]:
  run = _one_shot_run(op, x)
  return _time(lambda: (run(),), repeat)


def _step_time(op: Callable, repeat: int, calls: int = 2000) -> float:
  """Seconds per call of a jitted training-like step (a 16x16 matmul and a
  sum, then `op`) called from a Python loop, until its callbacks drained."""
  weights = jnp.ones((16, 16), jnp.float32)
  step = jax.jit(lambda x: op(jnp.sum(x @ weights)))
  x = jnp.ones((16, 16), jnp.float32)

  def run():
    start = time.perf_counter()
    for _ in range(calls):
      out = step(x)
    jax.block_until_ready(out)
    _drain()
    return ((time.perf_counter() - start) / calls,)
  return _time(run, repeat)[0]


# --- Progress bars: `make(n, print_rate)` gives a scan body's decorator ------

def _hcb_bar(n: int, print_rate: Optional[int]) -> Callable:
  return scan_tqdm(n, print_rate, file=open(os.devnull, "w"))


def _no_bar(n: int, print_rate: Optional[int]) -> Callable:
  del n, print_rate
  return lambda body: body


def _installed(module: str, name: str, rows: str, pip: str) -> Optional[Any]:
  """`module` where it is installed; else None, with a note that the `rows`
  rows have no `name` column."""
  try:
    return importlib.import_module(module)
  except ImportError:
    print(f"note: {name} is not installed, so the {rows} rows have no {name} "
          f"column (pip install {pip})", file=sys.stderr)
    return None


@functools.lru_cache(maxsize=None)
def _progress_baselines() -> Dict[str, Callable]:
  """jax-tqdm's bar where it is installed; else none, with a note."""
  jax_tqdm = _installed("jax_tqdm", "jax-tqdm", "progress-bar",
                        "'jax-tqdm==0.4.*'")
  if jax_tqdm is None:
    return {}
  return {"jax-tqdm": lambda n, print_rate: jax_tqdm.scan_tqdm(
      n, print_rate, file=open(os.devnull, "w"))}


def _bar_scan_time(make: Callable, steps: int, print_rate: Optional[int],
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
    _drain()
    return (time.perf_counter() - start,)
  return _time(run, repeat)[0]


def _per_update(make: Callable, steps: int, repeat: int) -> float:
  """Microseconds that each update of a bar with `print_rate=1` adds."""
  with_bar = _bar_scan_time(make, steps, 1, repeat)
  return 1e6 * (with_bar - _bar_scan_time(_no_bar, steps, 1, repeat)) / steps


# --- Watching loops: `make(f, sample_every)` gives `f` with a lens on it ----

def _hcb_lens(f: Callable, sample_every: int) -> Callable:
  return loops.verbose(f, on_step=_on_step, select=_scalar_select,
                       sample_every=sample_every)


def _no_lens(f: Callable, sample_every: int) -> Callable:
  del sample_every
  return f


def _scalar_select(leaves: tuple):
  """A scalar `select`: the mean of the carry's first leaf (the carry itself
  where it is a scalar)."""
  return jnp.mean(leaves[0])


@functools.lru_cache(maxsize=None)
def _lens_baselines() -> Dict[str, Callable]:
  """jax-tap's `verbose` where it is installed; else none, with a note."""
  jaxtap = _installed("jaxtap", "jaxtap", "loop", "jax-tap")
  if jaxtap is None:
    return {}
  return {"jaxtap": lambda f, sample_every: jaxtap.verbose(
      f, on_step=_on_step, select=_scalar_select, sample_every=sample_every)}


def _lens_scan_run(make: Callable, steps: int, sample_every: int,
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
  return _one_shot_run(make(scan, sample_every), (x, weights))


def _in_turns(runs: Dict[str, Callable[[], float]], turns: int
              ) -> Dict[str, float]:
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


def _can_confine() -> bool:
  """Whether `_on_one_core` can confine this process's threads (Linux)."""
  return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def _thread_ids() -> List[int]:
  return [int(tid) for tid in os.listdir("/proc/self/task")]


@contextlib.contextmanager
def _on_one_core() -> Iterator[None]:
  """Every thread of the process (XLA's pool and ours) on one core, the
  first this process may use, until the block ends; then each thread
  back on the cores it had (one started meanwhile: the process's). XLA
  splits a 64x64 matmul between the pool's threads; on a small VM whose
  cores differ in speed, how that split lands moves a scan's time by more
  than the 5% a lens may cost, from process to process."""
  allowed = os.sched_getaffinity(0)
  before = {}
  for tid in _thread_ids():
    with contextlib.suppress(OSError):  # a thread that ended meanwhile
      before[tid] = os.sched_getaffinity(tid)
      os.sched_setaffinity(tid, {min(allowed)})
  try:
    yield
  finally:
    for tid in _thread_ids():
      with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, before.get(tid, allowed))


def _per_event(make: Callable, steps: int, repeat: int) -> float:
  """Microseconds that each event of a lens with a scalar `select` adds to
  a trivial scan step: the scans with and without the lens take turns
  (`_in_turns`), 4 * `repeat` each."""
  times = _in_turns({"lens": _lens_scan_run(make, steps, 1, 0),
                     "none": _lens_scan_run(_no_lens, steps, 1, 0)},
                    4 * repeat)
  return 1e6 * (times["lens"] - times["none"]) / steps


# --- The table -----------------------------------------------------------------

Row = Tuple[str, str, Dict[str, float]]  # scenario, unit, {implementation: value}


def _with_transport(name: str, measure: Callable[[], float]) -> float:
  jax.config.update("jax_host_callback_transport", name)
  try:
    return measure()
  finally:
    jax.config.update("jax_host_callback_transport", "auto")


def _in_mode(synchronous: bool, measure: Callable[[], float]
             ) -> Callable[[], float]:
  """`measure`, run in the synchronous mode where asked, else as it is (in
  the outfeed mode, the rows' default)."""
  return _synchronous(measure) if synchronous else measure


def _synchronous(measure: Callable[[], float]) -> Callable[[], float]:
  """`measure`, run in the synchronous mode (the CPU default)."""
  def run() -> float:
    jax.config.update("jax_host_callback_outfeed", False)
    try:
      return measure()
    finally:
      jax.config.update("jax_host_callback_outfeed", True)
  return run


def collect_barrier(quick: bool, repeat: int, only: str = "") -> List[Row]:
  """The barrier rows (tools/bench_barrier.py) whose scenario matches
  `only`; they must run before any other row."""
  transports = transport_policy.available_on_cpu()
  scale = 10 if quick else 1
  wanted = lambda scenario: bool(re.search(only, scenario))  # noqa: E731
  # The loop first: it taps on one device, as most training loops do.
  return (bench_barrier.training_loop_rows(transports, 1000 // scale, 10_000,
                                           repeat, wanted) +
          bench_barrier.idle_rows(transports, (0, 1000, 100_000 // scale),
                                  2000 // scale, wanted))


class _Rows:
  """The rows being collected: each measured on every transport and beside
  its baselines, if its scenario matches `only`."""

  def __init__(self, transports: List[str], only: str) -> None:
    self.transports = transports
    self.only = only
    self.rows: List[Row] = []

  def wanted(self, scenario: str) -> bool:
    return bool(re.search(self.only, scenario))

  def add(self, scenario: str, unit: str, ours: Callable[[Callable], float],
          baselines: Dict[str, Callable], factory: Callable,
          synchronous: bool = False) -> None:
    """Measures `ours(factory)` on each transport, and `ours(baseline)` for
    each baseline, in the synchronous mode or the outfeed one."""
    if not self.wanted(scenario):
      return
    measure_ours = _in_mode(synchronous, lambda: ours(factory))
    values = {f"hcb[{t}]": _with_transport(t, measure_ours)
              for t in self.transports}
    for name, baseline in baselines.items():
      values[name] = _in_mode(synchronous,
                              lambda baseline=baseline: ours(baseline))()
    self.rows.append((scenario, unit, values))

  def add_in_turns(self, scenario: str,
                   run_of: Callable[[Callable], Callable[[], float]],
                   baselines: Dict[str, Callable], factory: Callable,
                   turns: int, synchronous: bool = False,
                   confined: Callable[[], Any] = contextlib.nullcontext
                   ) -> None:
    """As `add`, in ms, for runs (in seconds) of `run_of(factory)` and
    `run_of(baseline)` that take turns (`_in_turns`) on each transport,
    inside the context `confined()` makes; a baseline's column shows its
    runs beside the last transport's (the native one, where built)."""
    if not self.wanted(scenario):
      return
    values: Dict[str, float] = {}
    for transport in self.transports:
      def measure() -> float:
        with confined():
          times = _in_turns({"ours": run_of(factory),
                             **{name: run_of(b)
                                for name, b in baselines.items()}}, turns)
        ours = times.pop("ours")
        values.update(times)  # beside the last transport's, in the end
        return ours
      values[f"hcb[{transport}]"] = _with_transport(
          transport, _in_mode(synchronous, measure))
    self.rows.append((scenario, "ms",
                      {name: 1e3 * seconds for name, seconds in values.items()}))


def _step_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """A jitted step with one tap or call, from a Python loop."""
  del scale  # the same sizes in --quick
  add = rows.add
  add("jitted step with one tap, per call from a Python loop", "µs",
      lambda make: 1e6 * _step_time(make(_noop), repeat),
      {**NOTHING, **TAPPERS}, _tap_hcb)
  add("jitted step with one tap, per call from a Python loop (synchronous)",
      "µs", lambda make: 1e6 * _step_time(make(_noop), repeat),
      {**NOTHING, **TAPPERS}, _tap_hcb, synchronous=True)
  add("jitted step with one call x+1, per call from a Python loop", "µs",
      lambda make: 1e6 * _step_time(make(lambda a: a + 1), repeat),
      {**NOTHING, **CALLERS}, _call_hcb)


def _scan_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Taps in long scans."""
  add = rows.add
  steps = 100_000 // scale
  for index, label in ((0, "until ready"), (1, "until drained")):
    add(f"tap f32 scalar, per step of a {steps}-step scan ({label})", "µs",
        lambda make, i=index: 1e6 * _scan_times(make(_noop), steps,
                                                jnp.float32(0), repeat)[i],
        TAPPERS, _tap_hcb)
  add(f"tap f32 scalar, per step of a {steps}-step scan (synchronous)", "µs",
      lambda make: 1e6 * _scan_times(make(_noop), steps, jnp.float32(0),
                                     repeat)[0], TAPPERS, _tap_hcb,
      synchronous=True)
  steps = 10_000 // scale
  add(f"tap f32[1000], per step of a {steps}-step scan (until drained)", "µs",
      lambda make: 1e6 * _scan_times(make(_noop), steps, jnp.zeros(1000),
                                     repeat)[1], TAPPERS, _tap_hcb)


def _large_array_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Large arrays: taps, calls, sizes, shards."""
  del scale  # the same sizes in --quick
  add = rows.add
  big = jnp.zeros((8, 1024, 1024), jnp.float32)
  add("tap of 32 MiB f32[8,1024,1024] (until drained)", "ms",
      lambda make: 1e3 * _one_shot_times(make(_noop), big, repeat)[0],
      TAPPERS, _tap_hcb)
  identity = lambda a: a  # noqa: E731
  for mib in (32, 256):
    shape = f"f32[{mib // 4},1024,1024]"
    # (synchronous, copy, scenario)
    taps = [(synchronous, copy,
             f"large tap of {mib} MiB {shape}, until the host function ran"
             + suffix)
            for synchronous, copy, suffix in (
                (False, True, ""), (True, True, " (synchronous)"),
                (True, False, " (synchronous, copy=False)"))]
    calls = [(copy, f"large call round trip of {mib} MiB {shape}, identity"
              + suffix) for copy, suffix in ((True, ""),
                                             (False, ", copy=False"))]
    if not any(rows.wanted(name)
               for name in [t[2] for t in taps] + [c[1] for c in calls]):
      continue  # do not allocate the array
    array = jnp.zeros((mib // 4, 1024, 1024), jnp.float32)
    for synchronous, copy, scenario in taps:
      add(scenario, "ms",
          lambda make, a=array: 1e3 * _one_shot_times(make(_noop), a,
                                                       repeat)[0],
          {**YARDSTICK, "io_callback": lambda f: _first(_tap_io(f))},
          lambda f, copy=copy: _first(_tap_hcb(f, copy)),
          synchronous=synchronous)
    for copy, scenario in calls:
      add(scenario, "ms",
          lambda make, a=array: 1e3 * _one_shot_times(make(identity), a,
                                                       repeat)[0],
          {**YARDSTICK, **CALLERS}, lambda f, copy=copy: _call_hcb(f, copy))
    del array
  scenario = ("large call round trip of 256 MiB f32[64,1024,1024], "
              "identity, buffers=True filling out= (synchronous)")
  if rows.wanted(scenario):
    array = jnp.zeros((64, 1024, 1024), jnp.float32)
    add(scenario, "ms",
        lambda make, a=array: 1e3 * _one_shot_times(make(_copy_into), a,
                                                     repeat)[0],
        {**YARDSTICK, "hcb call": lambda f: _call_hcb(lambda a: a),
         **_buffer_callbacks()}, _call_hcb_filling, synchronous=True)
    del array
  for size, label in ((1, "4 B"), (1 << 14, "64 KiB"), (1 << 18, "1 MiB"),
                      (1 << 22, "16 MiB"), (1 << 28, "1 GiB")):
    scenario = f"size sweep: tap of {label} f32[{size}] (until drained)"
    if not rows.wanted(scenario):
      continue
    array = jnp.zeros(size, jnp.float32)
    add(scenario, "ms",
        lambda make, a=array: 1e3 * _one_shot_times(make(_noop), a,
                                                     repeat)[0],
        {}, lambda f: _first(_tap_hcb(f)))
    del array
  scenario = ("sharded tap of 256 MiB f32[64,1024,1024] over 4 devices by "
              "rows, partitioned, until the host functions ran")
  if rows.wanted(scenario):
    mesh = jax.make_mesh((4,), ("rows",))
    array = jax.device_put(jnp.zeros((64, 1024, 1024), jnp.float32),
                           NamedSharding(mesh, P("rows")))
    add(scenario, "ms",
        lambda make, a=array: 1e3 * _one_shot_times(make(_noop), a,
                                                     repeat)[0],
        {"hcb gathered": lambda f: _first_of_rows(_tap_hcb(f)),
         "debug.callback(partitioned)":
             lambda f: _first_of_rows(_tap_debug_partitioned(f))},
        lambda f: _first_of_rows(_tap_hcb_partitioned(f)))
    del array


def _slow_consumer_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Taps whose host function takes 1 ms."""
  add = rows.add
  taps = 1000 // scale
  for index, label in ((0, "jitted call returns"), (1, "result ready"),
                       (2, "consumers drained")):
    add(f"{taps} taps with a 1 ms consumer: {label}", "ms",
        lambda make, i=index: 1e3 * _slow_consumer_times(make(_sleep_1ms), taps,
                                                         repeat)[i],
        TAPPERS, _tap_hcb)
  add(f"{taps} taps with a 1 ms consumer: jitted call returns (synchronous)",
      "ms", lambda make: 1e3 * _slow_consumer_times(make(_sleep_1ms), taps,
                                                    repeat)[0],
      TAPPERS, _tap_hcb, synchronous=True)


def _call_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Calls in a scan, alone, and of 32 MiB."""
  add = rows.add
  big = jnp.zeros((8, 1024, 1024), jnp.float32)
  steps = 10_000 // scale
  plus_one = lambda a: a + 1  # noqa: E731
  add(f"call x+1, per step of a {steps}-step scan", "µs",
      lambda make: 1e6 * _scan_times(make(plus_one), steps, jnp.float32(0),
                                     repeat)[1], CALLERS, _call_hcb)
  add("call x+1, one jitted call", "µs",
      lambda make: 1e6 * _one_shot_times(make(plus_one), jnp.float32(0),
                                         repeat)[0], CALLERS, _call_hcb)
  add("call round trip of 32 MiB f32[8,1024,1024] (x+1)", "ms",
      lambda make: 1e3 * _one_shot_times(make(plus_one), big, repeat)[0],
      CALLERS, _call_hcb)


def _bar_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Progress bars beside jax-tqdm's."""
  add = rows.add
  steps = 20_000 // scale
  for synchronous, label in ((True, "synchronous"), (False, "until drained")):
    add(f"progress bar update, per step of a {steps}-step scan of a 16x16 "
        f"matmul, print_rate=1 ({label})", "µs",
        lambda make: _per_update(make, steps, repeat),
        _progress_baselines() if synchronous else {}, _hcb_bar,
        synchronous=synchronous)
  add(f"{steps}-step scan of a 16x16 matmul with a progress bar at the "
      "default rate (synchronous)", "ms",
      lambda make: 1e3 * _bar_scan_time(make, steps, None, repeat),
      {"no bar": _no_bar, **_progress_baselines()}, _hcb_bar,
      synchronous=True)


def _loop_rows(rows: _Rows, scale: int, repeat: int) -> None:
  """Watching loops (host_callback.loops) beside jax-tap's."""
  steps = 20_000 // scale
  rows.add(f"loop event with a scalar select, per step of a {steps}-step "
           "scan (synchronous)", "µs",
           lambda make: _per_event(make, steps, repeat), _lens_baselines(),
           _hcb_lens, synchronous=True)
  # Short scans, many turns: a 5% difference is below the drift of one
  # long run here. Also on one core, where that can be done: see
  # `_on_one_core`.
  steps = 2000 // scale
  confinements = [("", contextlib.nullcontext)]
  if _can_confine():
    confinements.append((", on one core", _on_one_core))
  for where, confined in confinements:
    rows.add_in_turns(
        f"{steps}-step scan of a 64x64 matmul watched with sample_every=100, "
        f"scalar select (synchronous{where}, in turns with the scan without "
        "a lens)",
        lambda make: _lens_scan_run(make, steps, 100, 64),
        {"no lens": _no_lens, **_lens_baselines()}, _hcb_lens,
        turns=100 * repeat, synchronous=True, confined=confined)


def collect(quick: bool, repeat: int, only: str = "") -> List[Row]:
  """The rows whose scenario matches the regular expression `only`, topic
  by topic."""
  rows = _Rows(transport_policy.available_on_cpu(), only)
  scale = 10 if quick else 1
  # Rows are in the outfeed mode unless they say "synchronous".
  jax.config.update("jax_host_callback_outfeed", True)
  for topic in (_step_rows, _scan_rows, _large_array_rows,
                _slow_consumer_rows, _call_rows, _bar_rows, _loop_rows):
    topic(rows, scale, repeat)
  return rows.rows


def format_table(rows: List[Row]) -> str:
  """A table of `rows` with the columns that have values, and the ratios
  of each baseline to each of ours where a row has both."""
  names: List[str] = []
  for _, _, values in rows:
    names += [n for n in values if n not in names]
  ours = [n for n in names if n.startswith("hcb[")]
  theirs = [n for n in names if not n.startswith("hcb[")]
  pairs = [(t, o) for o in ours for t in theirs
           if any(t in values and o in values for _, _, values in rows)]
  header = ["scenario", "unit", *names, *[f"{t} / {o}" for t, o in pairs]]
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for scenario, unit, values in rows:
    cells = [scenario, unit]
    cells += [f"{values[n]:.3g}" if n in values else "" for n in names]
    cells += [f"{values[t] / values[o]:.2f}x" if t in values and o in values
              and values[o] > 0 else "" for t, o in pairs]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def machine() -> str:
  return (f"{platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, jax {jax.__version__}, "
          f"{jax.devices()[0].platform}")


# --- The page --------------------------------------------------------------------

# The summary, a row per question a user asks: (question, the scenario that
# answers it, as a regular expression, JAX's alternatives, of which the
# fastest in the row is shown, and a column that gives the scale, if any).
SUMMARY: List[Tuple[str, str, Tuple[str, ...], Optional[str]]] = [
    ("a tap in a jitted step (synchronous, the CPU default)",
     r"jitted step with one tap, per call from a Python loop \(synchronous\)",
     ("debug.callback", "io_callback"), "no callback"),
    ("a tap in a jitted step (outfeed mode)",
     r"jitted step with one tap, per call from a Python loop",
     ("debug.callback", "io_callback"), "no callback"),
    ("a tap in a scan, per step (synchronous)",
     r"tap f32 scalar, per step of a \d+-step scan \(synchronous\)",
     ("debug.callback", "io_callback"), None),
    ("a tap in a scan, per step (outfeed mode, until the taps ran)",
     r"tap f32 scalar, per step of a \d+-step scan \(until drained\)",
     ("debug.callback", "io_callback"), None),
    ("a call in a jitted step",
     r"jitted step with one call x\+1, per call from a Python loop",
     ("pure_callback", "io_callback"), "no callback"),
    ("a call in a scan, per step", r"call x\+1, per step of a \d+-step scan",
     ("pure_callback", "io_callback"), None),
    ("a large array to the host: a 256 MiB tap (outfeed mode)",
     r"large tap of 256 MiB \S+, until the host function ran",
     ("io_callback",), "jit(x+1)"),
    ("a large array to the host without a copy: a 256 MiB tap "
     "(synchronous, copy=False)",
     r"large tap of 256 MiB \S+, until the host function ran "
     r"\(synchronous, copy=False\)", ("io_callback",), "jit(x+1)"),
    ("a large array to the host and back: a 256 MiB call",
     r"large call round trip of 256 MiB \S+, identity",
     ("pure_callback", "io_callback"), "jit(x+1)"),
    ("a large array to the host and back without a copy: a 256 MiB call "
     "filling out= (synchronous, buffers=True)",
     r"large call round trip of 256 MiB \S+, identity, buffers=True "
     r"filling out= \(synchronous\)", ("buffer_callback",), "jit(x+1)"),
    ("each device's shard to the host: a 256 MiB tap sharded over 4 "
     "devices (partitioned=True)", r"sharded tap of 256 MiB .*",
     ("debug.callback(partitioned)",), "hcb gathered"),
    ("the barrier, with nothing to wait for (1 device)",
     r"idle barrier_wait, 1 device, 0 live arrays \(synchronous.*\)",
     ("effects_barrier",), None),
    ("a barrier after every ~1 ms step",
     r"\d+-step loop of a ~1 ms jitted step .*\(native, synchronous\)",
     ("block_until_ready",), "no barrier"),
    ("a progress bar, per update (print_rate=1, synchronous)",
     r"progress bar update, .*print_rate=1 \(synchronous\)", ("jax-tqdm",),
     None),
    ("a loop event of unmodified code (jax-tap's telemetry), per step, "
     "scalar select (synchronous)",
     r"loop event with a scalar select, per step of a \d+-step scan "
     r"\(synchronous\)", ("jaxtap",), None),
    ("a scan with a progress bar at the default rate (synchronous)",
     r"\d+-step scan of a 16x16 matmul with a progress bar at the default "
     r"rate \(synchronous\)", ("jax-tqdm",), "no bar"),
]

# The detail tables, by topic: (title, scenarios as a regular expression,
# what to know to read them).
TOPICS: List[Tuple[str, str, str]] = [
    ("Taps in a jitted step", r"jitted step with one tap.*",
     "A jitted step (a 16x16 matmul and a sum) with one tap of the sum, "
     "called 2000 times from a Python loop, until its taps ran; `no "
     "callback` is the same step without the tap."),
    ("Taps in a scan", r"tap f32.*per step.*",
     "\"until ready\": until the scan's output is ready; \"until "
     "drained\": until every tap function ran."),
    ("Calls", r"(jitted step with one call|call ).*", ""),
    ("Large arrays", r"(tap of \d+ MiB|large |size sweep).*",
     "`jit(x+1)` is one pass over the same array: the yardstick for a tap "
     "(one copy) and a call. The taps return one element of the array, "
     "not the array, so that XLA copies nothing for the output."),
    ("Sharded values", r"sharded tap.*",
     "A tap with `partitioned=True` (each device sends its own shard) "
     "beside the same tap gathered to one device (`hcb gathered`, the "
     "default) and `jax.debug.callback(partitioned=True)`; the taps return "
     "the first element of each row, so that nothing is gathered for the "
     "output."),
    ("Slow host functions", r"\d+ taps with a 1 ms consumer.*", ""),
    ("Watching loops", r"(loop event|\d+-step scan of a 64x64).*",
     "`host_callback.loops.verbose` (jax-tap's interface) against jax-tap's "
     "own (no column where jax-tap was not installed): what each step's "
     "event adds to a trivial scan step (the scans with and without the "
     "lens taking turns), and a scan of a 64x64 matmul "
     "sampled every 100 steps beside the same scan without a lens, as it "
     "runs and with every thread of the process on one core: XLA splits "
     "the matmul between its pool's threads, and on a 2-core VM whose "
     "cores differ in speed how that split lands moves the scan's time, "
     "and the ratio, by more than 5% from one process to the next; on one "
     "core the ratio repeats."),
    ("Progress bars", r".*progress bar.*",
     "`host_callback.tqdm.scan_tqdm` against jax-tqdm 0.4's (no column "
     "where jax-tqdm was not installed) and the same scan without a bar."),
]

BARRIER_INTRO = (
    "An idle barrier (nothing pending) at several numbers of live arrays, "
    "beside `jax.effects_barrier()` (which waits for JAX's own effects "
    "only), and a training loop with a barrier every step against the "
    "same loop without it (ratio above 0.98: within 2%) and with "
    "`block_until_ready` of each step's output instead, the least any wait "
    "for a step's tap costs; the three loops take turns every 100 steps, "
    "so that the machine's drift reaches all of them, and each figure is "
    "the median of those stretches. On a 2-core VM these ratios still move "
    "by 0.05 from run to run. Why the loop rows stay above 2% there: see "
    "\"What the counters cost and cover\" in `docs/architecture.md`.")


def _ratio(value: float) -> str:
  """A ratio to 2 significant figures or so: 230x, 18x, 8.1x, 0.31x."""
  if value >= 10:
    return f"{value:.0f}x"
  return f"{value:.1f}x" if value >= 1 else f"{value:.2f}x"


def _ours(values: Dict[str, float]) -> Optional[str]:
  """Our column: the native transport's, else the Python one's."""
  return next((n for n in ("hcb[native]", "hcb[python]") if n in values),
              None)


def summary_table(rows: List[Row]) -> str:
  """The summary: a row per question of SUMMARY that `rows` answer."""
  lines = ["| question | host_callback | best JAX alternative | "
           "alternative / host_callback | for scale |",
           "|---|---|---|---|---|"]
  for question, pattern, alternatives, scale in SUMMARY:
    row = next((r for r in rows if re.fullmatch(pattern, r[0])), None)
    ours = None if row is None else _ours(row[2])
    if row is None or ours is None:
      continue
    _, unit, values = row
    mine = f"{values[ours]:.3g} {unit}" + (
        "" if ours == "hcb[native]" else " (python transport)")
    present = [a for a in alternatives if a in values]
    best = min(present, key=values.__getitem__) if present else None
    theirs = (f"`{best}` {values[best]:.3g} {unit}" if best else
              f"none measured ({', '.join(alternatives)} not installed)")
    ratio = _ratio(values[best] / values[ours]) if best else ""
    scaled = (f"{scale}: {values[scale]:.3g} {unit}"
              if scale and scale in values else "")
    lines.append(f"| {question} | {mine} | {theirs} | {ratio} | {scaled} |")
  return "\n".join(lines)


def page(rows: List[Row], barrier_rows: List[Row], machine_line: str) -> str:
  """docs/benchmarks.md: the summary, then the detail tables by topic."""
  parts = [
      "# Benchmarks\n\nGenerated from one run of `python -m tools.bench "
      f"--write docs` on {machine_line}. Rows run in the outfeed mode "
      "unless they say \"synchronous\" (the CPU default); times are "
      "medians. Ratios are the alternative's time / host_callback's: above "
      "1, host_callback is faster.\n\n## Summary\n\nOne row per question, "
      "host_callback on its native transport beside the fastest of JAX's "
      "own callbacks that does the same; the detail tables below have "
      "both transports and every alternative.\n\n"
      + summary_table(rows + barrier_rows)]
  left = list(rows)
  for title, pattern, note in TOPICS:
    chosen = [r for r in left if re.fullmatch(pattern, r[0])]
    left = [r for r in left if r not in chosen]
    if chosen:
      parts.append(f"## {title}\n\n" + (note + "\n\n" if note else "")
                   + format_table(chosen))
  if left:
    parts.append("## Other\n\n" + format_table(left))
  if barrier_rows:
    parts.append("## barrier_wait\n\n" + BARRIER_INTRO + "\n\n"
                 + format_table(barrier_rows))
  return "\n\n".join(parts) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="10x smaller sizes, for a smoke test")
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--only", default="", metavar="REGEX",
                      help="run only the rows whose scenario matches")
  parser.add_argument("--write", metavar="DOCS_DIR",
                      help="also write DOCS_DIR/benchmarks.md")
  options = parser.parse_args()
  barrier_rows = collect_barrier(options.quick, options.repeat, options.only)
  rows = collect(options.quick, options.repeat, options.only)
  table = format_table(rows)
  barrier_table = format_table(barrier_rows)
  print(machine())
  print("\n\n".join(t for t, r in ((table, rows), (barrier_table, barrier_rows))
                    if r))
  if options.write:
    with open(os.path.join(options.write, "benchmarks.md"), "w") as out:
      out.write(page(rows, barrier_rows, machine()))

if __name__ == "__main__":
  main()
