"""host_callback.loops on several devices and over long runs: the device
of each event under `pmap`, `shard_map` and a sharded `jit`, whole or
per shard with `partitioned=True` (each device's events in its program
order, all delivered by `barrier_wait`), and a recorder that keeps the
last N events."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import host_callback as hcb
import host_callback.loops as tap
from helpers import cpu_devices

STEPS = 5


def count(x):
  """A scan that adds 1 to its carry STEPS times."""
  return jax.lax.scan(lambda c, _: (c + 1.0, None), x, None, length=STEPS)[0]


def by_device(events):
  """{device: [(step, value), ...]} in the order the events came."""
  seen = {}
  for e in events:
    seen.setdefault(e.device, []).append((e.step, float(np.sum(e.value))))
  return seen


@pytest.mark.usefixtures("both_modes")
def test_pmap_each_device_reports_its_steps_in_order():
  devices = cpu_devices(4)
  events = []
  g = jax.pmap(tap.verbose(count, on_step=events.append,
                           select=lambda leaves: leaves[0]), devices=devices)
  out = g(jnp.arange(4.0))
  hcb.barrier_wait()
  assert np.asarray(out).tolist() == [5.0, 6.0, 7.0, 8.0]
  assert by_device(events) == {
      d: [(s, i + s + 1.0) for s in range(STEPS)]
      for i, d in enumerate(devices)}


@pytest.mark.usefixtures("both_modes")
def test_sharded_jit_reports_each_step_of_the_whole_value_once():
  devices = cpu_devices(4)
  sharding = NamedSharding(Mesh(np.array(devices), ("i",)), P("i"))
  x = jax.device_put(jnp.zeros(8), sharding)
  with tap.record(select=lambda leaves: leaves[0]) as rec:
    out = jax.jit(count)(x)
  # The block's close waited for the taps (barrier_wait).
  assert np.asarray(out).tolist() == [5.0] * 8
  assert [(e.step, float(np.sum(e.value))) for e in rec.events] == [
      (s, 8.0 * (s + 1)) for s in range(STEPS)]
  assert {e.device for e in rec.events} <= set(devices)
  assert len({e.device for e in rec.events}) == 1


def test_events_of_one_device_name_it():
  with tap.record(select=lambda _: ()) as rec:
    jax.jit(count)(jnp.float32(0))
  assert {e.device for e in rec.events} == {jax.devices()[0]}
  assert tap.TapEvent("scan[0]", 0, ()).device is None  # jax-tap's fields


@pytest.mark.usefixtures("both_modes")
def test_a_bounded_recorder_keeps_the_last_events_and_counts_the_rest():
  with tap.record(select=lambda leaves: leaves[0], max_events=3) as rec:
    count(jnp.float32(0))
    count(jnp.float32(10))
  assert [(e.step, float(e.value)) for e in rec.events] == [
      (2, 13.0), (3, 14.0), (4, 15.0)]
  assert rec.dropped == 2 * STEPS - 3
  g, unbounded = tap.record(count)
  g(jnp.float32(0))
  hcb.barrier_wait()
  assert len(unbounded.events) == STEPS and unbounded.dropped == 0


def test_a_recorder_s_events_can_be_cleared_as_jax_tap_s():
  for recorder in (tap.FlightRecorder(), tap.FlightRecorder(max_events=2)):
    for step in range(3):
      recorder(tap.TapEvent("scan[0]", step, ()))
    recorder.events = []
    recorder(tap.TapEvent("scan[0]", 3, ()))
    assert [e.step for e in recorder.events] == [3] and recorder.dropped == 0


def test_a_recorder_bound_must_be_positive():
  with pytest.raises(ValueError, match="max_events must be None or >= 1"):
    tap.FlightRecorder(max_events=0)


def _mesh(devices):
  """A mesh with explicit axes (jax.make_mesh's default) over `devices`."""
  return jax.make_mesh((len(devices),), ("i",), devices=devices)


@pytest.mark.usefixtures("both_modes")
def test_shard_map_each_device_reports_its_shard_s_steps_in_order():
  devices = cpu_devices(4)
  events = []
  g = jax.jit(jax.shard_map(
      tap.verbose(count, on_step=events.append,
                  select=lambda leaves: leaves[0]),
      mesh=Mesh(np.array(devices), ("i",)), in_specs=P("i"),
      out_specs=P("i")))
  out = g(jnp.arange(8.0))
  hcb.barrier_wait()
  assert np.asarray(out).tolist() == [float(i + STEPS) for i in range(8)]
  # Device i holds [2i, 2i + 1]: after step s, their sum is 4i + 1 + 2(s+1).
  assert by_device(events) == {
      d: [(s, 4.0 * i + 1 + 2 * (s + 1)) for s in range(STEPS)]
      for i, d in enumerate(devices)}


@pytest.mark.usefixtures("both_modes")
def test_partitioned_sharded_jit_gives_each_device_its_shard_s_events():
  devices = cpu_devices(4)
  mesh = _mesh(devices)
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  with tap.record(select=lambda leaves: leaves[0], partitioned=True) as rec:
    out = jax.jit(count)(x)
  assert np.asarray(out).tolist() == [float(i + STEPS) for i in range(8)]
  assert by_device(rec.events) == {
      d: [(s, 4.0 * i + 1 + 2 * (s + 1)) for s in range(STEPS)]
      for i, d in enumerate(devices)}
  assert all(np.shape(e.value) == (2,) for e in rec.events)


@pytest.mark.usefixtures("both_modes")
def test_several_devices_events_are_all_in_after_barrier_wait():
  """pmap and a sharded jit return before their taps ran: barrier_wait
  is what waits for their events, then a second call's come in order."""
  devices = cpu_devices(4)
  events = []
  g = jax.pmap(tap.verbose(count, on_step=events.append,
                           select=lambda leaves: leaves[0]), devices=devices)
  g(jnp.zeros(4))
  g(jnp.ones(4))
  hcb.barrier_wait()
  assert by_device(events) == {
      d: [(s, float(s + 1)) for s in range(STEPS)] +
         [(s, float(s + 2)) for s in range(STEPS)] for d in devices}
