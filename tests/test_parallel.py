"""pmap, shard_map and sharded jit: which device taps, with which value.

The golden pmap cases (pmap of id_print, pmap of vmap, pmap of call) are in
test_golden.py. The devices are CPU devices (`cpu_devices`), whatever the
default backend is. Every test here runs in the outfeed and in the
synchronous mode.
"""

import io
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import host_callback as hcb
from helpers import Recorder, assert_tree_equal, batch, cpu_devices

NDEV = 4
pytestmark = pytest.mark.usefixtures("both_modes")


def by_device(rec):
  """{device: [args in arrival order]} from a tap_with_device recorder."""
  out = {}
  for arg, _, device in rec.calls:
    out.setdefault(device, []).append(arg)
  return out


def test_conftest_gives_four_cpu_devices():
  assert len(jax.devices("cpu")) == NDEV


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_tap_with_device_reports_the_committed_device(jit):
  rec = Recorder()
  x = jax.device_put(jnp.arange(3.), cpu_devices(NDEV)[2])
  f = lambda v: hcb.id_tap(rec, v, tap_with_device=True)  # noqa: E731
  (jax.jit(f) if jit else f)(x)
  hcb.barrier_wait()
  assert rec.devices == [cpu_devices(NDEV)[2]]
  assert_tree_equal(rec.args, [np.arange(3., dtype=np.float32)])


# --- pmap ---------------------------------------------------------------------


def test_pmap_each_device_taps_its_slice():
  rec = Recorder()
  x = jnp.arange(NDEV * 2.).reshape(NDEV, 2)
  out = jax.pmap(lambda v: hcb.id_tap(rec, v * 10, tap_with_device=True),
                 devices=cpu_devices(NDEV))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, x * 10)
  got = by_device(rec)
  assert set(got) == set(cpu_devices(NDEV))
  for i, device in enumerate(cpu_devices(NDEV)):
    assert_tree_equal(got[device], [np.array([20. * i, 20. * i + 10.],
                                             np.float32)])
  assert rec.transforms == [()] * NDEV


def test_pmap_order_per_device_in_loop_and_across_calls():
  rec = Recorder()

  def f(x):
    return lax.fori_loop(
        0, 3, lambda i, acc: acc + hcb.id_tap(rec, (x, i),
                                              tap_with_device=True)[1], 0)

  g = jax.pmap(f, devices=cpu_devices(NDEV))
  for step in range(2):
    np.testing.assert_array_equal(g(jnp.arange(NDEV) + 100 * step),
                                  [3] * NDEV)
  hcb.barrier_wait()
  got = by_device(rec)
  for d, device in enumerate(cpu_devices(NDEV)):
    assert [(int(x), int(i)) for x, i in got[device]] == [
        (100 * step + d, i) for step in range(2) for i in range(3)]


def test_pmap_without_device_and_grad():
  rec = Recorder()
  g = jax.pmap(jax.grad(lambda v: hcb.id_tap(rec, v * 2) ** 2),
               devices=cpu_devices(NDEV))(jnp.arange(float(NDEV)))
  hcb.barrier_wait()
  np.testing.assert_array_equal(g, 8 * np.arange(NDEV))
  assert sorted(float(v) for v in rec.args) == [0., 2., 4., 6.]
  assert rec.devices == [None] * NDEV


def test_barrier_covers_every_device():
  rec = Recorder()

  def slow(arg, transforms, *, device):
    time.sleep(0.01)
    rec(arg, transforms, device=device)

  f = jax.pmap(lambda v: hcb.id_tap(slow, v, tap_with_device=True),
               devices=cpu_devices(NDEV))
  outputs = [f(jnp.arange(NDEV) + 10 * step) for step in range(5)]
  hcb.barrier_wait()
  np.testing.assert_array_equal(outputs, [np.arange(NDEV) + 10 * step
                                          for step in range(5)])
  assert len(rec.calls) == 5 * NDEV
  for d, device in enumerate(cpu_devices(NDEV)):
    assert [int(v) for v in by_device(rec)[device]] == [
        10 * step + d for step in range(5)]


def test_concurrent_prints_do_not_interleave():
  stream = io.StringIO()

  def f(x):
    return lax.fori_loop(0, 25, lambda i, acc: hcb.id_print(
        (acc, jnp.full((2, 2), i)), tap_with_device=True, what="w",
        output_stream=stream)[0] + 1, x)

  out = jax.pmap(f, devices=cpu_devices(NDEV))(jnp.arange(NDEV) * 100)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(NDEV) * 100 + 25)
  lines = stream.getvalue().splitlines()
  assert len(lines) == NDEV * 25 * 3  # header, then a 2-line value
  per_device = {}
  for header, first, second in zip(lines[::3], lines[1::3], lines[2::3]):
    assert header.startswith("device: ") and header.endswith(" what: w")
    per_device.setdefault(header, []).append(first + "|" + second)
  assert sorted(per_device) == sorted(
      f"device: {d} what: w" for d in cpu_devices(NDEV))
  for d, device in enumerate(cpu_devices(NDEV)):
    assert per_device[f"device: {device} what: w"] == [
        f"( {100 * d + i} [[{i} {i}]| [{i} {i}]] )" for i in range(25)]


# --- shard_map: per-device code taps per device ---------------------------------


def test_shard_map_taps_each_devices_block():
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(NDEV)), ("d",))
  f = jax.jit(jax.shard_map(
      lambda v: hcb.id_tap(rec, v + 1, tap_with_device=True),
      mesh=mesh, in_specs=P("d"), out_specs=P("d")))
  out = f(jnp.arange(2. * NDEV))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(2. * NDEV) + 1)
  got = by_device(rec)
  assert set(got) == set(cpu_devices(NDEV))
  for d, device in enumerate(cpu_devices(NDEV)):
    assert_tree_equal(got[device], [np.array([2. * d + 1, 2. * d + 2],
                                             np.float32)])


def test_shard_map_order_per_device_in_scan():
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(NDEV)), ("d",))

  def block(v):
    return lax.scan(lambda c, i: (c + hcb.id_tap(rec, (v[0], i),
                                                 tap_with_device=True)[1],
                                  None), 0, jnp.arange(3))[0][None]

  out = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))(jnp.arange(NDEV) * 10)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [3] * NDEV)
  for d, device in enumerate(cpu_devices(NDEV)):
    assert [(int(x), int(i)) for x, i in by_device(rec)[device]] == [
        (10 * d, 0), (10 * d, 1), (10 * d, 2)]


# --- sharded jit: one tap, of the whole array, from device_index -----------------


@pytest.mark.parametrize("device_index", [0, 1])
def test_sharded_jit_taps_whole_array_once(device_index):
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(2)), ("d",))
  x = jnp.array([[0, 1, 2], [10, 11, 12]], jnp.int32)

  def f(v):
    z = jnp.dot(v, jnp.ones((3, 4), jnp.int32))
    return hcb.id_tap(rec, z, tap_with_device=True,
                      device_index=device_index)

  out = jax.jit(f, in_shardings=NamedSharding(mesh, P("d")))(x)
  hcb.barrier_wait()
  expected = np.array([[3] * 4, [33] * 4], np.int32)
  np.testing.assert_array_equal(out, expected)
  assert_tree_equal(rec.args, [expected])
  assert rec.devices == [cpu_devices(NDEV)[device_index]]


def test_device_index_of_cpu_devices_where_the_default_backend_has_one(
    monkeypatch):
  """On a GPU machine the default backend has one device and the CPU four:
  a tap on CPU device 1 of a sharded jit is not refused at trace time."""
  monkeypatch.setattr(jax, "device_count", lambda backend=None: 1)
  test_sharded_jit_taps_whole_array_once(1)


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
@pytest.mark.parametrize("sharded_input", [False, True])
def test_taps_and_calls_under_set_mesh(axis_type, sharded_input):
  """Modern sharding code: jit under `jax.set_mesh`, with explicit or auto
  axes, on a 2x2 mesh, with sharded or unsharded inputs."""
  rec = Recorder()
  axis_types = (getattr(jax.sharding.AxisType, axis_type),) * 2
  mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=axis_types,
                       devices=cpu_devices(4))
  x = jnp.arange(16.).reshape(4, 4)
  if sharded_input:
    x = jax.device_put(x, NamedSharding(mesh, P("a", "b")))

  @jax.jit
  def f(v):
    v = hcb.id_tap(rec, v * 2, tap_with_device=True, device_index=1)
    return hcb.call(lambda a: a + 1, v, result_shape=v)

  with jax.set_mesh(mesh):
    out = f(x)
    shard_mapped = jax.jit(jax.shard_map(
        lambda v: hcb.id_tap(rec, v, tap_with_device=True),
        in_specs=P("a", "b"), out_specs=P("a", "b")))(
            jax.device_put(x, NamedSharding(mesh, P("a", "b"))))
  hcb.barrier_wait()
  expected = np.arange(16., dtype=np.float32).reshape(4, 4) * 2
  np.testing.assert_array_equal(out, expected + 1)
  np.testing.assert_array_equal(shard_mapped, expected / 2)
  assert_tree_equal(rec.args[0], expected)
  assert rec.devices[0] == mesh.devices.flat[1]
  blocks = {d: (a[0, 0], a.shape) for a, d in zip(rec.args[1:], rec.devices[1:])}
  assert blocks == {mesh.devices[i, j]: (8. * i + 2. * j, (2, 2))
                    for i in range(2) for j in range(2)}


@pytest.mark.parametrize("op", ["tap", "call"])
def test_sharded_jit_rejects_device_index_beyond_its_devices(op):
  """device_index=3 exists in the process (4 devices) but not in a jit over
  2 of them: an error, never a dropped tap or a call that returns zeros."""
  ran = []
  mesh = Mesh(np.array(cpu_devices(2)), ("d",))

  def f(v):
    if op == "tap":
      return hcb.id_tap(lambda a, _: ran.append(a), v, device_index=3)
    return hcb.call(lambda a: ran.append(a) or a, v, result_shape=v,
                    device_index=3)

  with pytest.raises(ValueError, match=r"device_index=3 is out of range for a "
                     r"computation on 2 device\(s\); use 0 to 1"):
    jax.jit(f, in_shardings=NamedSharding(mesh, P("d")))(jnp.arange(4.))
  hcb.barrier_wait()
  assert ran == []


@pytest.mark.parametrize("device_index", [0, 2])
def test_eager_tap_of_sharded_array(device_index):
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(NDEV)), ("d",))
  x = jax.device_put(jnp.arange(8.), NamedSharding(mesh, P("d")))
  out = hcb.id_tap(rec, x, tap_with_device=True, device_index=device_index)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(8.))
  assert_tree_equal(rec.args, [np.arange(8., dtype=np.float32)])
  assert rec.devices == [cpu_devices(NDEV)[device_index]]


def test_sharded_jit_four_devices_2d_mesh():
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(NDEV)).reshape(2, 2), ("a", "b"))
  x = jnp.arange(16.).reshape(4, 4)
  sharding = NamedSharding(mesh, P("a", "b"))
  f = jax.jit(lambda v: hcb.id_tap(rec, (v, v.sum()), tap_with_device=True,
                                   device_index=3)[0] * 2,
              in_shardings=sharding, out_shardings=sharding)
  out = f(jax.device_put(x, sharding))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, x * 2)
  assert_tree_equal(rec.args, [(np.arange(16., dtype=np.float32).reshape(4, 4),
                                np.float32(120.))])
  assert rec.devices == [cpu_devices(NDEV)[3]]


def test_sharded_jit_with_vmap_and_loop():
  rec = Recorder()
  mesh = Mesh(np.array(cpu_devices(2)), ("d",))

  def f(v):
    return lax.fori_loop(0, 2, lambda i, acc: hcb.id_tap(rec, acc + 1), v)

  out = jax.jit(jax.vmap(f), in_shardings=NamedSharding(mesh, P("d")))(
      jnp.arange(4.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(4.) + 2)
  assert_tree_equal(rec.args, [np.arange(4., dtype=np.float32) + 1,
                               np.arange(4., dtype=np.float32) + 2])
  assert rec.transforms == [(batch(0),)] * 2
