"""`python -m host_callback`: a jitted training loop that reports its progress.

Fits a line with gradient descent inside one `jax.jit`-ed `lax.scan`; every
step taps its loss to the host with `id_tap`, every 50th step prints with
`id_print`, a tqdm bar (`host_callback.tqdm.scan_tqdm`, when tqdm is
installed) shows the progress on stderr, and `barrier_wait` waits for the
reports before the summary.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import host_callback as hcb
from host_callback.host import transport_policy
from host_callback.tqdm import scan_tqdm

STEPS = 200


def with_bar(step: Callable) -> Callable:
  """`step` with a progress bar, or as it is without tqdm."""
  try:
    return scan_tqdm(STEPS, desc="training")(step)
  except ImportError:
    print("(no progress bar: pip install tqdm for one)")
    return step


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """`--help` says what the demo does; `--version` prints the version."""
  parser = argparse.ArgumentParser(
      prog="python -m host_callback",
      description="Runs a demo: a jitted training loop (a lax.scan of "
      f"{STEPS} gradient steps) that taps its loss to the host every step "
      "with id_tap, prints every 50th step with id_print, shows a progress "
      "bar when tqdm is installed, and waits with barrier_wait. It also "
      "tells which transport this installation uses.")
  parser.add_argument("--version", action="version",
                      version=f"host-callback {hcb.__version__}")
  return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
  parse_args(argv)
  losses: list[float] = []

  def record_loss(loss: np.ndarray, transforms: tuple) -> None:
    losses.append(float(loss))

  xs = jnp.linspace(-1.0, 1.0, 64)
  ys = 3.0 * xs + 0.5

  def loss_fn(params):
    w, b = params
    return jnp.mean((w * xs + b - ys) ** 2)

  @with_bar
  def step(params, i):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    hcb.id_tap(record_loss, loss)
    jax.lax.cond(i % 50 == 0,
                 lambda: hcb.id_print((i, loss), what="step, loss"),
                 lambda: (i, loss))
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss

  @jax.jit
  def train(params):
    return jax.lax.scan(step, params, jnp.arange(STEPS))

  transport = transport_policy.for_platform("cpu")
  print(f"host_callback demo on {jax.devices()[0]} ({transport} transport)")
  start = time.perf_counter()
  (w, b), _ = train((jnp.float32(0.0), jnp.float32(0.0)))
  jax.block_until_ready(w)
  hcb.barrier_wait()
  elapsed = time.perf_counter() - start
  print(f"received {len(losses)} losses from the device: first "
        f"{losses[0]:.4f}, last {losses[-1]:.6f}")
  print(f"fitted w={float(w):.3f} b={float(b):.3f} (true 3.000, 0.500) "
        f"in {elapsed * 1000:.0f} ms including compilation")


if __name__ == "__main__":
  main()
