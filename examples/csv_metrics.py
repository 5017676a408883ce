"""Logging metrics to a CSV file from inside `jax.jit`.

The training step taps a dict of metrics; the host writes one CSV row per
tap, in the order the device ran the steps, while training goes on.

    python examples/csv_metrics.py [metrics.csv]
"""

import csv
import sys

import jax
import jax.numpy as jnp
import numpy as np

import host_callback as hcb

STEPS = 300
FIELDS = ["step", "loss", "grad_norm", "w"]
writer = None  # the csv.DictWriter of the run in progress


def write_row(metrics, transforms):
  """Runs on the host with NumPy values: one row per training step."""
  writer.writerow({k: f"{v:.6g}" if v.dtype.kind == "f" else v.item()
                   for k, v in metrics.items()})


@jax.jit
def train(w, xs, ys):
  def step(w, i):
    loss, grad = jax.value_and_grad(
        lambda w: jnp.mean((xs @ w - ys) ** 2))(w)
    hcb.id_tap(write_row, {"step": i, "loss": loss, "w": w[0],
                           "grad_norm": jnp.linalg.norm(grad)})
    return w - 0.1 * grad, None
  return jax.lax.scan(step, w, jnp.arange(STEPS))[0]


if __name__ == "__main__":
  path = sys.argv[1] if len(sys.argv) > 1 else "metrics.csv"
  xs = jax.random.normal(jax.random.key(0), (64, 3))
  ys = xs @ jnp.array([1.0, -2.0, 0.5])
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS)
    writer.writeheader()
    w = train(jnp.zeros(3), xs, ys)
    hcb.barrier_wait()  # every row is written before the file closes
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  print(f"wrote {len(rows)} rows to {path}")
  print(f"first: {rows[0]}")
  print(f"last:  {rows[-1]}")
  print(f"w = {np.round(np.asarray(w), 3)}")
