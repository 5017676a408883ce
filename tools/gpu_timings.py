"""Timings that `tools.gpu_check` reports beside `tools.bench`'s rows, on the
default backend (a GPU's are the ones of interest):

    python -m tools.gpu_timings

- per step of a scan of tiny steps: no tap, a tap per step on each
  transport, a tap every 1000th step behind a `lax.cond`, and
  `jax.debug.callback`;
- a scan of a 16x16 matmul with `scan_tqdm` at its default rate and at
  `print_rate=1`, beside the scan without a bar;
- a training loop of a ~1 ms step (matrix products, sized on the device
  at hand) with a tap of the loss and `barrier_wait()` every step, beside
  the same loop without the tap and the barrier.

Each row is (name, value, unit); medians of a few runs.
"""

from __future__ import annotations

import os
import time
from typing import Callable, List, Tuple

import jax
import jax.numpy as jnp

import host_callback as hcb
from host_callback import settings
from host_callback.tqdm import scan_tqdm

from . import bench_barrier

Row = Tuple[str, float, str]
TRANSPORTS = ("native", "python")


def _noop(*args, **kwargs) -> None:
  return None


def _median(values: List[float]) -> float:
  return sorted(values)[len(values) // 2]


def _timed(run: Callable[[], None], repeat: int = 3) -> float:
  """Median seconds of `run()` (which waits for its work), after one
  untimed run that compiles."""
  run()
  times = []
  for _ in range(repeat):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return _median(times)


def scan_rows(steps: int = 20000) -> List[Row]:
  """µs per step of a scan of tiny steps, with each kind of tap."""
  def scan(op):
    def step(x, i):
      x = x * 0.999 + 1.0
      op(x, i)
      return x, None
    f = jax.jit(lambda x: jax.lax.scan(step, x, jnp.arange(steps))[0])

    def run():
      jax.block_until_ready(f(jnp.float32(0)))
      hcb.barrier_wait()
    return 1e6 * _timed(run) / steps

  tap = lambda x, i: hcb.id_tap(_noop, x)  # noqa: E731
  rare = lambda x, i: jax.lax.cond(  # noqa: E731
      i % 1000 == 0, lambda: (hcb.id_tap(_noop, i), None)[1], lambda: None)
  rows = [("scan step, no tap", scan(lambda x, i: None), "µs")]
  for transport in TRANSPORTS:
    with settings.transport(transport):
      rows.append((f"+ id_tap every step ({transport})", scan(tap), "µs"))
      rows.append((f"+ id_tap every 1000th step in a lax.cond ({transport})",
                   scan(rare), "µs"))
  rows.append(("+ jax.debug.callback every step",
               scan(lambda x, i: jax.debug.callback(_noop, x)), "µs"))
  return rows


def bar_rows(steps: int = 20000) -> List[Row]:
  """ms for a scan of a 16x16 matmul with `scan_tqdm`, until drained."""
  weights = jnp.eye(16, dtype=jnp.float32) * 0.5

  def scan_time(bar: Callable[[Callable], Callable]) -> float:
    body = bar(lambda carry, i: (jnp.tanh(carry @ weights + i), None))
    f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(steps))[0])

    def run():
      jax.block_until_ready(f(jnp.ones((16, 16), jnp.float32)))
      hcb.barrier_wait()
    return 1e3 * _timed(run)

  rows = [(f"{steps}-step scan of a 16x16 matmul, no bar",
           scan_time(lambda body: body), "ms")]
  for transport in TRANSPORTS:
    for print_rate, label in ((None, "default rate"), (1, "print_rate=1")):
      with settings.transport(transport):
        bar = scan_tqdm(steps, print_rate, file=open(os.devnull, "w"))
        rows.append((f"... with scan_tqdm at the {label} ({transport})",
                     scan_time(bar), "ms"))
  return rows


def _step_of(size: int, products: int, tapped: bool) -> Callable:
  weights = jnp.full((size, size), 1e-4, jnp.float32)

  # The step returns its loss: with a tap's result unused, XLA's CPU
  # compiler fails on this step (jax 0.10.2 to 0.12.0.1: "RET_CHECK
  # failure ... instruction tanh.1 is live and cannot be removed", also
  # with jax.debug.callback).
  @jax.jit
  def step(x):
    for _ in range(products):
      x = jnp.tanh(x @ weights)
    loss = jnp.sum(x)
    return (hcb.id_tap(_noop, loss) if tapped else loss), x
  return step


def training_rows(steps: int = 300) -> List[Row]:
  """ms per step of a loop of a ~1 ms step from Python: without a tap
  (and waiting for nothing, or for each step's output), and with a tap of
  the loss and `barrier_wait()` after every step on each transport
  (`bench_barrier.loop_times`: the loops take turns, medians)."""
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

  def on(transport: str) -> Callable:
    def step(y):
      with settings.transport(transport):
        return tapped(y)
    return step

  loops = {"no tap, no barrier": (plain, _noop),
           "no tap, block_until_ready every step": (plain,
                                                    jax.block_until_ready)}
  for transport in TRANSPORTS:
    loops[f"tap + barrier_wait() every step ({transport})"] = (
        on(transport), lambda y: hcb.barrier_wait())
  bench_barrier.loop_times(x, 20, 1, loops)  # compiles
  times = bench_barrier.loop_times(x, steps, 1, loops)
  return [(f"~1 ms step ({products} products of {size}x{size}): {name}",
           value, "ms") for name, value in times.items()]


def main() -> None:
  for rows in (scan_rows, bar_rows, training_rows):
    for name, value, unit in rows():
      print(f"{name}: {value:.3f} {unit}", flush=True)


if __name__ == "__main__":
  main()
