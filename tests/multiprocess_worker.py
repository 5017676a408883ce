"""One process of the 2-process test (tests/test_multiprocess.py).

Usage: python multiprocess_worker.py PROCESS_ID PORT. Prints one JSON line
`RESULT {...}` with what this process's host functions received.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"  # 2 CPU devices, whatever else there is

import jax  # noqa: E402

process_id, port = int(sys.argv[1]), sys.argv[2]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2,
                           process_id=process_id, initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import host_callback as hcb  # noqa: E402

log = []


def record(kind):
  def tap(arg, transforms, device):
    log.append([kind, device.id, np.asarray(arg).tolist()])
  return tap


# pmap over the local devices: each device taps its own slice.
jax.pmap(lambda x: hcb.id_tap(record("pmap"), x, tap_with_device=True))(
    jnp.arange(2.) + 10 * process_id)
hcb.barrier_wait()

# Sharded jit over the 4 global devices: one tap, from the device_index device.
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.make_array_from_callback((4,), NamedSharding(mesh, P("d")),
                                 lambda index: np.arange(4.)[index])
for device_index in (0, 3):
  jax.jit(lambda v: hcb.id_tap(record(f"jit{device_index}"), v * 2,
                               tap_with_device=True,
                               device_index=device_index))(x).block_until_ready()

# A call from the last device returns the whole array to every process.
result = jax.jit(lambda v: hcb.call(
    lambda a, device: (log.append(["call", device.id, a.tolist()]), a + 1)[1],
    v, result_shape=v, call_with_device=True, device_index=3))(x)
shards = sorted(np.asarray(s.data).tolist() for s in result.addressable_shards)
hcb.barrier_wait()

# Partitioned, over a mesh with an explicit axis: each device sends its own
# shard, in its own process, and a call returns each device its shard.
explicit = Mesh(np.array(jax.devices()), ("d",),
                axis_types=(jax.sharding.AxisType.Explicit,))
xe = jax.make_array_from_callback((4,), NamedSharding(explicit, P("d")),
                                  lambda index: np.arange(4.)[index])


def shard_tap(arg, transforms, shard):
  log.append(["part", shard.device.id, arg.tolist(), shard.index[0].start])


def shard_call(arg, shard):
  log.append(["pcall", shard.device.id, arg.tolist(), shard.index[0].start])
  return arg * 100 + shard.index[0].start


jax.jit(lambda v: hcb.id_tap(shard_tap, v, partitioned=True,
                             tap_with_shard=True))(xe).block_until_ready()
partitioned = jax.jit(lambda v: hcb.call(
    shard_call, v, result_shape=v, partitioned=True,
    call_with_shard=True))(xe)
partitioned_shards = sorted(np.asarray(s.data).tolist()
                            for s in partitioned.addressable_shards)
hcb.barrier_wait()


# An exception in a tap surfaces in the process where the tap ran.
def fail_on_last_device(arg, transforms, device):
  if device.id == jax.devices()[-1].id:
    raise ValueError("raised on the last device")


jax.jit(lambda v: hcb.id_tap(fail_on_last_device, v, tap_with_device=True,
                             device_index=3))(x).block_until_ready()
try:
  hcb.barrier_wait()
  raised = None
except hcb.CallbackException as error:
  raised = str(error.__cause__)

print("RESULT " + json.dumps({
    "local": [d.id for d in jax.local_devices()],
    "all": [d.id for d in jax.devices()],
    "log": sorted(log), "shards": shards,
    "partitioned_shards": partitioned_shards, "raised": raised}), flush=True)
jax.distributed.shutdown()
