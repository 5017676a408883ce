"""A tqdm progress bar over a jitted `lax.scan` training loop.

Every `REPORT_EVERY` steps the device taps the step's loss to the host with
`id_tap`; the tap function moves the bar. The training loop itself never
waits for the bar: `barrier_wait()` waits for the last report before closing.

    python examples/progress_bar.py
"""

import jax
import jax.numpy as jnp
from tqdm import tqdm

import host_callback as hcb

STEPS = 2000
REPORT_EVERY = 100
bar = None  # the tqdm bar of the training run in progress


def report(loss, transforms):
  """Runs on the host, on the receiver thread, while the device trains on."""
  bar.update(REPORT_EVERY)
  bar.set_postfix(loss=f"{float(loss):.2e}")


def loss_fn(params, xs, ys):
  w, b = params
  return jnp.mean((w * xs + b - ys) ** 2)


@jax.jit
def train(params, xs, ys):
  def step(params, i):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
    # A tap inside `cond` happens only on the steps that take that branch.
    jax.lax.cond((i + 1) % REPORT_EVERY == 0,
                 lambda: hcb.id_tap(report, loss), lambda: loss)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss
  return jax.lax.scan(step, params, jnp.arange(STEPS))


if __name__ == "__main__":
  xs = jnp.linspace(-1.0, 1.0, 256)
  ys = 3.0 * xs + 0.5
  with tqdm(total=STEPS, desc="training") as bar:
    (w, b), losses = train((0.0, 0.0), xs, ys)
    hcb.barrier_wait()  # the last report has reached the bar
  print(f"w={float(w):.3f} b={float(b):.3f} final loss={float(losses[-1]):.2e}")
