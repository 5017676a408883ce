"""Timings that `tools.gpu.check` reports beside `tools.bench`'s rows, on the
default backend (a GPU's are the ones of interest):

    python -m tools.gpu.timings                 # every case, in this process
    python -m tools.gpu.timings --case NAME     # one case (CASES)
    python -m tools.gpu.timings --list          # the cases' names

- per step of a scan of tiny steps: no tap, a tap per step on each
  transport, a tap every 1000th step behind a `lax.cond`,
  `jax.debug.callback`, and the floors of a tap (`tools/bench/floors.py`):
  a custom call that does nothing (XLA's dispatch of one) and one that
  calls a Python function that does nothing;
- a scan of a 16x16 matmul with `scan_tqdm` at its default rate and at
  `print_rate=1`, beside the scan without a bar;
- a training loop of a ~1 ms step (matrix products, sized on the device
  at hand) with a tap of the loss and `barrier_wait()` every step, beside
  the same loop without the tap and the barrier, and with either alone;
- a small jitted step (one product of 16x16, as the training loop's) from
  a Python loop: without a tap, with a native tap, with a native tap in an
  executable lowered without the host callbacks that keep its host
  function alive, and with the floor's custom call that does nothing
  instead of a tap (diagnostics: what of a jitted step with a tap costs
  most on a GPU, those callbacks or XLA's custom call; the loops take
  turns);
- a 256 MiB identity round trip with `call(..., buffers=True)` filling
  `out=` by a CuPy copy on the computation's stream, beside one
  device-to-device copy, `jax.experimental.buffer_callback` (CuPy too)
  and `jax.pure_callback` (needs CuPy; no rows without it).

Each row is (name, value, unit), printed as `format_row` writes it;
medians of a few runs. `tools.gpu.check` runs each case in a fresh process
(`--case`): a process that ran other work before (a soak, other rows)
measured a scan step several times slower on an H200.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import jax
import jax.numpy as jnp

import host_callback as hcb
from host_callback import _jax_adapter as adapter
from host_callback import settings
from host_callback.tqdm import scan_tqdm

from tools.bench import floors
from tools.bench.barrier_scenarios import loop_times, upper_median

Row = Tuple[str, float, str]
TRANSPORTS = ("native", "python")


def _noop(*args, **kwargs) -> None:
  return None


def _timed(run: Callable[[], None], repeat: int = 3) -> float:
  """Median seconds of `run()` (which waits for its work), after one
  untimed run that compiles."""
  run()
  times = []
  for _ in range(repeat):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return upper_median(times)


def _scan_step_us(op: Callable, steps: int = 20000) -> float:
  """µs per step of a scan of tiny steps that calls `op(x, i)` each step,
  until its taps ran."""
  def step(x, i):
    x = x * 0.999 + 1.0
    op(x, i)
    return x, None
  f = jax.jit(lambda x: jax.lax.scan(step, x, jnp.arange(steps))[0])

  def run():
    jax.block_until_ready(f(jnp.float32(0)))
    hcb.barrier_wait()
  return 1e6 * _timed(run) / steps


def _tap(x, i) -> None:
  hcb.id_tap(_noop, x)


def _floor_op(kind: str) -> Callable:
  """The floor `kind`'s custom call (`tools.bench.floors`) for the default
  backend's XLA platform."""
  op = floors.step_op(kind, "cpu" if jax.default_backend() == "cpu"
                      else "CUDA")
  if op is None:
    raise RuntimeError("the floors need the native module")
  return op


def _rare_tap(x, i) -> None:
  jax.lax.cond(i % 1000 == 0, lambda: (hcb.id_tap(_noop, i), None)[1],
               lambda: None)


def _scan_case(name: str, op: Callable, transport: Optional[str] = None
               ) -> Callable[[], List[Row]]:
  """The case of the scan row `name`: a tap by `op`, on `transport`."""
  def case() -> List[Row]:
    with (settings.transport(transport) if transport
          else contextlib.nullcontext()):
      return [(name, _scan_step_us(op), "µs")]
  return case


def _bar_scan_ms(bar: Callable[[Callable], Callable], steps: int) -> float:
  """ms for a scan of a 16x16 matmul whose body `bar` wraps, until
  drained."""
  weights = jnp.eye(16, dtype=jnp.float32) * 0.5
  body = bar(lambda carry, i: (jnp.tanh(carry @ weights + i), None))
  f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(steps))[0])

  def run():
    jax.block_until_ready(f(jnp.ones((16, 16), jnp.float32)))
    hcb.barrier_wait()
  return 1e3 * _timed(run)


def _bar_case(print_rate: Optional[int], transport: Optional[str],
              steps: int = 20000) -> Callable[[], List[Row]]:
  """The case of a bar row: `scan_tqdm` at `print_rate` (None: its
  default) on `transport`; no bar where `transport` is None."""
  def case() -> List[Row]:
    if transport is None:
      return [(f"{steps}-step scan of a 16x16 matmul, no bar",
               _bar_scan_ms(lambda body: body, steps), "ms")]
    label = "default rate" if print_rate is None else f"print_rate={print_rate}"
    with settings.transport(transport):
      bar = scan_tqdm(steps, print_rate, file=open(os.devnull, "w"))
      return [(f"... with scan_tqdm at the {label} ({transport})",
               _bar_scan_ms(bar, steps), "ms")]
  return case


def _step_of(size: int, products: int, tapped: bool,
             floor: Optional[str] = None) -> Callable:
  """A jitted step of `products` products of `size`x`size` that returns
  its loss and state, with a tap of the loss where `tapped`, or the floor
  `floor`'s custom call on it."""
  weights = jnp.full((size, size), 1e-4, jnp.float32)
  observe = _floor_op(floor) if floor else None

  # The step returns its loss: with a tap's result unused, XLA's CPU
  # compiler fails on this step (jax 0.10.2 to 0.12.0.1: "RET_CHECK
  # failure ... instruction tanh.1 is live and cannot be removed", also
  # with jax.debug.callback).
  @jax.jit
  def step(x):
    for _ in range(products):
      x = jnp.tanh(x @ weights)
    loss = jnp.sum(x)
    if observe is not None:
      loss = observe(loss)
    return (hcb.id_tap(_noop, loss) if tapped else loss), x
  return step


def _on(transport: str, step: Callable) -> Callable:
  """`step`, called (and so compiled) on `transport`."""
  def on_transport(x):
    with settings.transport(transport):
      return step(x)
  return on_transport


def training_rows(steps: int = 300) -> List[Row]:
  """ms per step of a loop of a ~1 ms step from Python: without a tap
  (and waiting for nothing, or for each step's output), and with a tap of
  the loss and `barrier_wait()` after every step on each transport
  (`tools.bench.barrier_scenarios.loop_times`: the loops take turns,
  medians)."""
  size = 256 if jax.default_backend() == "cpu" else 2048
  x = jnp.ones((size, size), jnp.float32)
  one = _step_of(size, 1, False)

  def ten_steps():
    y = x
    for _ in range(10):
      _, y = one(y)
    jax.block_until_ready(y)
  per_product = _timed(ten_steps, 5) / 10
  products = max(1, round(1e-3 / per_product))
  plain = _step_of(size, products, False)
  tapped = _step_of(size, products, True)
  loops = {"no tap, no barrier": (plain, _noop),
           "no tap, block_until_ready every step": (plain,
                                                    jax.block_until_ready)}
  for transport in TRANSPORTS:
    loops[f"tap + barrier_wait() every step ({transport})"] = (
        _on(transport, tapped), lambda y: hcb.barrier_wait())
  # Which of the two costs what (a diagnostic): the tap alone, the
  # barrier alone.
  loops["tap + block_until_ready every step (native)"] = (
      _on("native", tapped), jax.block_until_ready)
  loops["no tap, barrier_wait() every step (native)"] = (
      _on("native", plain), lambda y: hcb.barrier_wait())
  loop_times(x, 20, 1, loops)  # compiles
  times = loop_times(x, steps, 1, loops)
  return [(f"~1 ms step ({products} products of {size}x{size}): {name}",
           value, "ms") for name, value in times.items()]


@contextlib.contextmanager
def _lowered_without_host_callbacks() -> Iterator[None]:
  """Meanwhile our lowerings add no host callback to the executable (on
  CPU, where the barrier needs it, and everywhere: the one that keeps the
  host function alive; the host function here is a module's)."""
  saved = (adapter.keep_alive_with_executable,
           adapter.run_to_completion_at_dispatch)
  adapter.keep_alive_with_executable = lambda ctx, obj: None
  adapter.run_to_completion_at_dispatch = lambda ctx: None
  try:
    yield
  finally:
    (adapter.keep_alive_with_executable,
     adapter.run_to_completion_at_dispatch) = saved


def host_callback_rows(steps: int = 2000) -> List[Row]:
  """µs per call of a small jitted step from a Python loop: no tap, one
  native tap, and one native tap in an executable without host callbacks
  (`tools.bench.barrier_scenarios.loop_times`: the loops take turns,
  medians)."""
  x = jnp.ones((16, 16), jnp.float32)
  # Each loop pays for the same `with` of the transport.
  loops = {"no tap": _on("native", _step_of(16, 1, False)),
           "one native tap": _on("native", _step_of(16, 1, True)),
           "one custom call that does nothing (XLA's floor)": _on(
               "native", _step_of(16, 1, False, floor="dispatch"))}
  with _lowered_without_host_callbacks():
    bare = loops["one native tap, executable without host callbacks"] = (
        _on("native", _step_of(16, 1, True)))
    bare(x)  # compiles without them
  times = loop_times(
      x, steps, 1, {name: (step, _noop) for name, step in loops.items()})
  return [(f"jitted 16x16 step from a Python loop: {name}", 1e3 * value,
           "µs") for name, value in times.items()]


def _cupy_copy(source: Any, out: Any, stream: int) -> None:
  """`out[...] = source` by CuPy on `stream`, both through DLPack."""
  import cupy  # pylint: disable=import-outside-toplevel
  with cupy.cuda.ExternalStream(stream):
    cupy.copyto(cupy.from_dlpack(out), cupy.from_dlpack(source))


def _round_trips(x: jax.Array) -> Dict[str, Callable[[jax.Array], Any]]:
  """Identity round trips of `x` by each way, jitted, by row name."""
  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  ways = {
      "one device-to-device copy (jit(jnp.copy))": jnp.copy,
      "call buffers=True filling out= (native, CuPy)":
          lambda v: hcb.call(lambda a, *, out, stream: _cupy_copy(
              a, out, stream), v, result_shape=shape, buffers=True),
      "jax.pure_callback": lambda v: jax.pure_callback(
          lambda a: a, shape, v)}
  try:
    from jax.experimental.buffer_callback import buffer_callback  # pylint: disable=import-outside-toplevel
  except ImportError:
    return {name: jax.jit(way) for name, way in ways.items()}
  ways["jax.experimental.buffer_callback (CuPy)"] = buffer_callback(
      lambda ctx, out, a: _cupy_copy(a, out, ctx.stream), shape)
  return {name: jax.jit(way) for name, way in ways.items()}


def buffers_rows() -> List[Row]:
  """ms for a 256 MiB identity round trip by each way (no rows without
  CuPy)."""
  try:
    import cupy  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return []
  x = jnp.zeros((64, 1024, 1024), jnp.float32)
  with settings.transport("native"):
    return [(f"256 MiB identity round trip: {name}",
             1e3 * _timed(lambda f=run: f(x).block_until_ready()), "ms")
            for name, run in _round_trips(x).items()]


def _cases() -> Dict[str, Callable[[], List[Row]]]:
  """Every case by name, in the order of the rows."""
  cases: Dict[str, Callable[[], List[Row]]] = {
      "scan/no-tap": _scan_case("scan step, no tap", lambda x, i: None)}
  for transport in TRANSPORTS:
    cases[f"scan/tap-{transport}"] = _scan_case(
        f"+ id_tap every step ({transport})", _tap, transport)
    cases[f"scan/rare-tap-{transport}"] = _scan_case(
        f"+ id_tap every 1000th step in a lax.cond ({transport})", _rare_tap,
        transport)
  cases["scan/debug-callback"] = _scan_case(
      "+ jax.debug.callback every step",
      lambda x, i: jax.debug.callback(_noop, x))
  for kind, what in (("dispatch", "a custom call that does nothing"),
                     ("python", "a custom call that calls a Python "
                                "function that does nothing")):
    cases[f"scan/floor-{kind}"] = _scan_case(
        f"+ {what} every step (the floor)",
        lambda x, i, kind=kind: _floor_op(kind)(x))
  cases["bars/no-bar"] = _bar_case(None, None)
  for transport in TRANSPORTS:
    cases[f"bars/default-rate-{transport}"] = _bar_case(None, transport)
    cases[f"bars/every-step-{transport}"] = _bar_case(1, transport)
  # One case: its loops take turns, so that drift reaches them alike.
  cases["training"] = training_rows
  cases["step/host-callbacks"] = host_callback_rows
  cases["buffers/256MiB"] = buffers_rows
  return cases


CASES = _cases()


def format_row(row: Row) -> str:
  """A row's line, as `parse_row` reads it back."""
  name, value, unit = row
  return f"{name}: {value:.3f} {unit}"


def parse_row(line: str) -> Optional[Row]:
  """The row of a `format_row` line; None for any other line."""
  name, _, figure = line.rpartition(": ")
  value, _, unit = figure.partition(" ")
  try:
    return (name, float(value), unit) if name and unit else None
  except ValueError:
    return None


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--case", choices=sorted(CASES),
                      help="only this case (default: every case)")
  parser.add_argument("--list", action="store_true",
                      help="print the cases' names and exit")
  args = parser.parse_args(argv)
  if args.list:
    print("\n".join(CASES))
    return
  for name in [args.case] if args.case else CASES:
    for row in CASES[name]():
      print(format_row(row), flush=True)


if __name__ == "__main__":
  main()
