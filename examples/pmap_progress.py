"""Per-device progress of a `pmap`-ed loop, told apart with `tap_with_device`.

Each device fits its own line (slope 1, 2, 3, ...) in a jitted `lax.scan`.
Its taps arrive on the host with `device=`, the `jax.Device` that sent them,
and move that device's tqdm bar. On a CPU-only machine the script asks XLA
for 4 CPU devices.

    python examples/pmap_progress.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
from tqdm import tqdm  # noqa: E402

import host_callback as hcb  # noqa: E402

STEPS = 500
REPORT_EVERY = 50
bars = {}  # device id -> tqdm bar
final_loss = {}  # device id -> last loss reported


def report(loss, transforms, device):
  bars[device.id].update(REPORT_EVERY)
  final_loss[device.id] = float(loss)


def fit(slope):
  xs = jnp.linspace(-1.0, 1.0, 128)
  ys = slope * xs

  def step(w, i):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((w * xs - ys) ** 2))(w)
    jax.lax.cond((i + 1) % REPORT_EVERY == 0,
                 lambda: hcb.id_tap(report, loss, tap_with_device=True),
                 lambda: loss)
    return w - 0.05 * grad, None
  return jax.lax.scan(step, 0.0, jnp.arange(STEPS))[0]


if __name__ == "__main__":
  devices = jax.local_devices()
  for position, device in enumerate(devices):
    bars[device.id] = tqdm(total=STEPS, desc=str(device), position=position)
  slopes = jnp.arange(1.0, len(devices) + 1)
  w = jax.pmap(fit)(slopes)
  hcb.barrier_wait()  # every device's last report has arrived
  for bar in bars.values():
    bar.close()
  for device, w_device in zip(devices, w):
    print(f"{device}: w={float(w_device):.3f} "
          f"loss={final_loss[device.id]:.1e}")
