"""Saving each device's shard of the parameters from inside a sharded step.

A partitioned tap (`partitioned=True`) hands each device's host function
its own rows of `w`, with no gather: each writes them to a file named by
where they lie (`shard.index`). A reader puts them back together.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python examples/sharded_checkpoint.py [DIR]
"""

import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import host_callback as hcb

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
mesh = jax.make_mesh((len(jax.devices()),), ("rows",))


def save_shard(arg, transforms, shard):
  """On the host, for each device: its rows of `w` at step `step`."""
  step, w = arg
  rows = shard.index[1][0]  # the index of w's shard: its rows
  np.save(folder / f"w_step{step}_rows{rows.start}-{rows.stop}.npy", w)


@jax.jit
def train_step(step, w, x, y):
  grad = jax.grad(lambda w: jnp.mean((x @ w.T - y) ** 2))(w)
  w = w - 0.1 * grad
  hcb.id_tap(save_shard, (step, w), partitioned=True, tap_with_shard=True)
  return w


def load(step, shape):
  """Puts a step's shard files back together."""
  w = np.zeros(shape, np.float32)
  for path in folder.glob(f"w_step{step}_rows*.npy"):
    start, stop = map(int, path.stem.split("_rows")[1].split("-"))
    w[start:stop] = np.load(path)
  return w


w = jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P("rows")))
x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 4)), jnp.float32)
y = x @ jnp.arange(32.).reshape(8, 4).T
for step in range(3):
  w = train_step(step, w, x, y)
hcb.barrier_wait()
files = sorted(folder.glob("w_step2_*.npy"))
print(f"step 2: {len(files)} shard files, one per device")
print("reassembled w equals the device array:",
      np.array_equal(load(2, w.shape), np.asarray(w)))
