"""Per-shard taps and calls (`partitioned=True`) under sharded `jit`: each
device's host function gets its own shard, nothing is gathered, and
`shard=` says where the shard lies. Both transports, both modes, 4 CPU
devices (the two-process case is in test_multiprocess.py)."""

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import host_callback as hcb
from helpers import cpu_devices

pytestmark = pytest.mark.usefixtures("both_modes")

_COLLECTIVES = re.compile(
    r"all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter")


def _mesh(shape, names):
  """A mesh with explicit axes (jax.make_mesh's default) over CPU devices."""
  return jax.make_mesh(shape, names, devices=cpu_devices(int(np.prod(shape))))


class _Shards:
  """A tap function recording (device id, value, index, replica id), in
  the order each device ran them."""

  def __init__(self):
    self.lock = threading.Lock()
    self.seen = []

  def __call__(self, arg, transforms, shard):
    with self.lock:
      self.seen.append((shard.device.id, np.asarray(arg).tolist(),
                        shard.index, shard.global_shape, shard.replica_id))

  def by_device(self):
    out = {}
    for device, *rest in self.seen:
      out.setdefault(device, []).append(tuple(rest))
    return out


def _collectives(jitted, *args):
  return sorted(set(_COLLECTIVES.findall(
      jitted.lower(*args).compile().as_text())))


def test_rows_over_four_devices_each_get_their_own_rows():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(16.).reshape(8, 2), NamedSharding(mesh, P("x")))
  record = _Shards()
  step = jax.jit(lambda v: hcb.id_tap(record, v * 2, partitioned=True,
                                      tap_with_shard=True) + 1)
  out = step(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(16.).reshape(8, 2) * 2 + 1)
  expected = {}
  for i, device in enumerate(mesh.devices.flat):
    rows = slice(2 * i, 2 * i + 2)
    expected[device.id] = [((np.arange(16.).reshape(8, 2) * 2)[rows].tolist(),
                            (rows, slice(None)), (8, 2), 0)]
  assert record.by_device() == expected
  assert _collectives(step, x) == []


def test_two_by_two_blocks_each_get_their_own_block():
  mesh = _mesh((2, 2), ("a", "b"))
  value = np.arange(16.).reshape(4, 4)
  x = jax.device_put(jnp.asarray(value), NamedSharding(mesh, P("a", "b")))
  record = _Shards()
  jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                               tap_with_shard=True))(x)
  hcb.barrier_wait()
  got = record.by_device()
  assert len(got) == 4
  for shard in x.addressable_shards:
    (data, index, global_shape, replica), = got[shard.device.id]
    assert index == shard.index and global_shape == (4, 4)
    assert data == value[shard.index].tolist() and replica == 0


def test_the_gathered_tap_has_a_collective_and_the_partitioned_none():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(8.), NamedSharding(mesh, P("x")))
  gathered = jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v))
  partitioned = jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v,
                                             partitioned=True))
  assert _collectives(gathered, x) != []
  assert _collectives(partitioned, x) == []


def test_a_replicated_value_gives_one_call_per_device_with_replica_ids():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(3.), NamedSharding(mesh, P()))
  record = _Shards()
  jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                               tap_with_shard=True))(x)
  hcb.barrier_wait()
  assert record.by_device() == {
      device.id: [([0., 1., 2.], (slice(None),), (3,), replica)]
      for replica, device in enumerate(mesh.devices.flat)}


def test_partly_replicated_blocks_number_their_replicas():
  mesh = _mesh((2, 2), ("a", "b"))
  x = jax.device_put(jnp.arange(8.).reshape(2, 4), NamedSharding(mesh, P("a")))
  record = _Shards()
  jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                               tap_with_shard=True))(x)
  hcb.barrier_wait()
  got = record.by_device()
  for shard in x.addressable_shards:
    (data, index, _, replica), = got[shard.device.id]
    assert (index, replica) == (shard.index, shard.replica_id)
    assert data == np.asarray(shard.data).tolist()


def test_a_partitioned_call_takes_and_returns_shards():
  mesh = _mesh((4,), ("x",))
  value = np.arange(16.).reshape(8, 2)
  x = jax.device_put(jnp.asarray(value), NamedSharding(mesh, P("x")))
  shapes = []

  def per_shard(a, shard):
    shapes.append(a.shape)
    return a * 10 + shard.index[0].start

  step = jax.jit(lambda v: hcb.call(per_shard, v, result_shape=v,
                                    partitioned=True, call_with_shard=True))
  out = step(x)
  expected = np.concatenate([value[2 * i:2 * i + 2] * 10 + 2 * i
                             for i in range(4)])
  np.testing.assert_array_equal(out, expected)
  assert out.sharding.spec == P("x") and shapes == [(2, 2)] * 4
  assert _collectives(step, x) == []


def test_a_partitioned_call_result_of_another_shape_is_split_the_same_way():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(8.), NamedSharding(mesh, P("x")))
  out = jax.jit(lambda v: hcb.call(
      lambda a: np.repeat(a, 3), v, partitioned=True,
      result_shape=jax.ShapeDtypeStruct((24,), jnp.float32)))(x)
  np.testing.assert_array_equal(
      out, np.concatenate([np.repeat([2. * i, 2. * i + 1], 3)
                           for i in range(4)]))


def test_a_result_that_cannot_be_split_like_the_operand_is_refused():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(8.), NamedSharding(mesh, P("x")))
  with pytest.raises(ValueError, match=re.escape(
      "host_callback.call(partitioned=True): result 0 of shape (6,) cannot "
      "be split as P('x',) over the mesh {'x': 4}: 6 is not a "
      "multiple of 4")):
    jax.jit(lambda v: hcb.call(
        lambda a: a[:1], v, partitioned=True,
        result_shape=jax.ShapeDtypeStruct((6,), jnp.float32)))(x)


def test_program_order_per_device_through_scan_while_cond_and_nested_jit():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.zeros(4), NamedSharding(mesh, P("x")))
  record = _Shards()

  def tap(v):
    return hcb.id_tap(record, v, partitioned=True, tap_with_shard=True)

  @jax.jit
  def step(v):
    v, _ = jax.lax.scan(lambda c, _: (tap(c + 1), None), v, None, length=3)
    _, v = jax.lax.while_loop(lambda c: c[0] < 2,
                              lambda c: (c[0] + 1, tap(c[1] + 1)), (0, v))
    v = jax.lax.cond(True, lambda c: tap(c + 10), lambda c: c, v)
    return jax.jit(tap)(v + 100)

  step(x)
  hcb.barrier_wait()
  got = record.by_device()
  assert sorted(got) == [d.id for d in mesh.devices.flat]
  for device, entries in got.items():
    assert [e[0] for e in entries] == [[1.], [2.], [3.], [4.], [5.], [15.],
                                       [115.]], device


def test_vmap_and_grad_go_through_it_as_for_any_tap():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(4.), NamedSharding(mesh, P("x")))
  seen = []
  lock = threading.Lock()

  def tap(a, transforms, device):
    with lock:
      seen.append((device.id, np.asarray(a).tolist(),
                   [name for name, _ in transforms]))

  grads = jax.jit(jax.grad(lambda v: jnp.sum(
      hcb.id_tap(tap, v, partitioned=True, tap_with_device=True) ** 2)))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(grads, 2 * np.arange(4.))
  assert sorted((d, a) for d, a, _ in seen if not _) == [
      (d.id, [float(i)]) for i, d in enumerate(mesh.devices.flat)]
  seen.clear()
  batch = jax.device_put(jnp.arange(8.).reshape(2, 4),
                         NamedSharding(mesh, P(None, "x")))
  jax.jit(jax.vmap(lambda v: hcb.id_tap(tap, v, partitioned=True,
                                        tap_with_device=True)))(batch)
  hcb.barrier_wait()
  assert sorted(seen) == sorted(
      (d.id, [[float(i)], [float(i + 4)]], ["batch"])
      for i, d in enumerate(mesh.devices.flat))


def test_eager_on_a_sharded_array_sends_each_shard():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(4.), NamedSharding(mesh, P("x")))
  record = _Shards()
  hcb.id_tap(record, x, partitioned=True, tap_with_shard=True)
  hcb.barrier_wait()
  assert record.by_device() == {
      d.id: [([float(i)], (slice(i, i + 1),), (4,), 0)]
      for i, d in enumerate(mesh.devices.flat)}


def test_on_one_device_it_is_a_plain_tap_of_the_whole_value():
  record = _Shards()
  x = jnp.arange(3.)
  jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                               tap_with_shard=True))(x)
  hcb.barrier_wait()
  device = jax.devices()[0].id
  assert record.by_device() == {
      device: [([0., 1., 2.], (slice(None),), (3,), 0)]}


def test_id_print_prints_each_shard_on_its_device():
  mesh = _mesh((4,), ("x",))
  x = jax.device_put(jnp.arange(4.), NamedSharding(mesh, P("x")))
  lines = []
  lock = threading.Lock()

  class Stream:
    def write(self, text):
      with lock:
        lines.append(text)

  jax.jit(lambda v: hcb.id_print(v, partitioned=True, tap_with_device=True,
                                 output_stream=Stream()))(x)
  hcb.barrier_wait()
  assert sorted(lines) == sorted(
      line for i, d in enumerate(mesh.devices.flat)
      for line in (f"device: cpu:{d.id}\n", f"[{i}.]\n"))


# --- Meshes with automatic axes (jax.sharding.Mesh's default): the jit fixes
# the shardings of its inputs and of sharding constraints, and the tap
# follows them.

def _auto_mesh(shape, names):
  """A mesh with automatic axes over CPU devices, as most code builds it."""
  devices = np.array(cpu_devices(int(np.prod(shape)))).reshape(shape)
  return jax.sharding.Mesh(devices, names,
                           axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _expected_shards(value, sharding):
  """What each device's host function must get for `value` sharded so: as
  the shards of a jax.Array put there, (data, index, global shape,
  replica id) by device id."""
  array = jax.device_put(jnp.asarray(value), sharding)
  return {shard.device.id: [(np.asarray(shard.data).tolist(), shard.index,
                             tuple(value.shape), shard.replica_id)]
          for shard in array.addressable_shards}


def test_auto_axes_rows_of_an_input_each_get_their_own_rows():
  mesh = _auto_mesh((4,), ("d",))
  value = np.arange(16.).reshape(8, 2)
  sharding = NamedSharding(mesh, P("d"))
  x = jax.device_put(jnp.asarray(value), sharding)
  record = _Shards()
  step = jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                                      tap_with_shard=True) * 2)
  out = step(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, value * 2)
  assert record.by_device() == _expected_shards(value, sharding)
  assert record.by_device()[mesh.devices.flat[1].id] == [
      (value[2:4].tolist(), (slice(2, 4), slice(None)), (8, 2), 0)]
  assert _collectives(step, x) == []


@pytest.mark.parametrize("spec", [P("a", "b"), P("b"), P(None, "a")])
def test_auto_axes_two_by_two_blocks_of_an_input(spec):
  mesh = _auto_mesh((2, 2), ("a", "b"))
  value = np.arange(16.).reshape(4, 4)
  sharding = NamedSharding(mesh, spec)
  x = jax.device_put(jnp.asarray(value), sharding)
  record = _Shards()
  step = jax.jit(lambda v: hcb.id_tap(record, v, partitioned=True,
                                      tap_with_shard=True))
  step(x)
  hcb.barrier_wait()
  assert record.by_device() == _expected_shards(value, sharding)
  assert _collectives(step, x) == []


@pytest.mark.parametrize("shape,names,spec", [
    ((4,), ("d",), P("d")),
    ((2, 2), ("a", "b"), P(("b", "a"))),
    ((2, 2), ("a", "b"), P("b")),
])
def test_auto_axes_a_constrained_value_is_sent_as_constrained(shape, names,
                                                              spec):
  mesh = _auto_mesh(shape, names)
  value = np.arange(8.)
  x = jax.device_put(jnp.asarray(value), NamedSharding(mesh, P()))
  record = _Shards()
  constrained = NamedSharding(mesh, spec)
  jax.jit(lambda v: hcb.id_tap(
      record, jax.lax.with_sharding_constraint(v * 3, constrained),
      partitioned=True, tap_with_shard=True))(x)
  hcb.barrier_wait()
  assert record.by_device() == _expected_shards(value * 3, constrained)


def test_auto_axes_a_partitioned_call_takes_and_returns_shards():
  mesh = _auto_mesh((4,), ("d",))
  value = np.arange(8.)
  x = jax.device_put(jnp.asarray(value), NamedSharding(mesh, P("d")))
  seen = []
  lock = threading.Lock()

  def per_shard(a, shard):
    with lock:
      seen.append((shard.device.id, a.tolist(), shard.index))
    return a * 10 + shard.index[0].start

  step = jax.jit(lambda v: hcb.call(per_shard, v, result_shape=v,
                                    partitioned=True, call_with_shard=True))
  out = step(x)
  np.testing.assert_array_equal(
      out, value * 10 + np.repeat(np.arange(0, 8, 2), 2))
  assert out.sharding.spec == P("d")
  assert sorted(seen) == sorted(
      (d.id, value[2 * i:2 * i + 2].tolist(), (slice(2 * i, 2 * i + 2),))
      for i, d in enumerate(mesh.devices.flat))
  assert _collectives(step, x) == []


def test_auto_axes_a_partitioned_call_of_a_constrained_2d_value():
  mesh = _auto_mesh((2, 2), ("a", "b"))
  value = np.arange(16.).reshape(4, 4)
  x = jax.device_put(jnp.asarray(value), NamedSharding(mesh, P()))
  blocks = NamedSharding(mesh, P("b", "a"))
  seen = {}
  lock = threading.Lock()

  def per_shard(a, shard):
    with lock:
      seen[shard.device.id] = (a.tolist(), shard.index)
    return -a

  out = jax.jit(lambda v: hcb.call(
      per_shard, jax.lax.with_sharding_constraint(v + 1, blocks),
      result_shape=v, partitioned=True, call_with_shard=True))(x)
  np.testing.assert_array_equal(out, -(value + 1))
  assert seen == {device: (data, index) for device, [(data, index, _, _)]
                  in _expected_shards(value + 1, blocks).items()}


def test_auto_axes_constrained_taps_keep_each_device_order_in_loops():
  mesh = _auto_mesh((4,), ("d",))
  sharding = NamedSharding(mesh, P("d"))
  x = jax.device_put(jnp.zeros(4), sharding)
  record = _Shards()

  def tap(v):
    v = jax.lax.with_sharding_constraint(v, sharding)
    return hcb.id_tap(record, v, partitioned=True, tap_with_shard=True)

  @jax.jit
  def step(v):
    v = tap(v + 1)
    v, _ = jax.lax.scan(lambda c, _: (tap(c + 1), None), v, None, length=3)
    v = tap(jax.lax.cond(True, lambda c: c * 10, lambda c: c, v))
    _, v = jax.lax.while_loop(lambda c: c[0] < 1,
                              lambda c: (c[0] + 1, tap(c[1] + 1)), (0, v))
    return jax.jit(tap)(v + 100)

  step(x)
  hcb.barrier_wait()
  got = record.by_device()
  assert sorted(got) == sorted(d.id for d in mesh.devices.flat)
  for entries in got.values():
    assert [e[0] for e in entries] == [[1.], [2.], [3.], [4.], [40.],
                                       [41.], [141.]]


def test_auto_axes_a_result_leaf_passes_by_whatever_its_sharding():
  mesh = _auto_mesh((4,), ("d",))
  sharding = NamedSharding(mesh, P("d"))
  x = jax.device_put(jnp.arange(4.), sharding)
  record = _Shards()
  out = jax.jit(lambda v: hcb.id_tap(record, v, result=v * 2 + 1,
                                     partitioned=True,
                                     tap_with_shard=True))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(4.) * 2 + 1)
  assert record.by_device() == _expected_shards(np.arange(4.), sharding)


def test_auto_axes_a_value_the_partitioner_shards_is_refused_with_the_fix():
  mesh = _auto_mesh((4,), ("d",))
  x = jax.device_put(jnp.arange(4.), NamedSharding(mesh, P("d")))
  with pytest.raises(ValueError, match=re.escape(
      "host_callback.id_tap(partitioned=True) on a mesh with automatic axes "
      "(d) sends each operand as the jit fixes its sharding")) as raised:
    jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v * 2,
                                 partitioned=True))(x)
  assert "jax.lax.with_sharding_constraint" in str(raised.value)
  assert "jax.make_mesh" in str(raised.value)


def test_a_tap_function_without_a_shard_parameter_fails_at_trace_time():
  with pytest.raises(TypeError, match=re.escape(
      "cannot be called as tap_func(arg, transforms, *, shard)")):
    hcb.id_tap(lambda a, t: None, jnp.arange(2.), partitioned=True,
               tap_with_shard=True)


def test_partitioned_must_be_a_bool():
  with pytest.raises(TypeError, match="partitioned must be True or False"):
    hcb.id_tap(lambda a, t: None, jnp.arange(2.), partitioned="yes")
