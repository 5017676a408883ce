"""pmap combined with other transformations: each device taps its own slice.

pmap runs over CPU devices (`cpu_devices`), whatever the default backend is.
Every test here runs in the outfeed and in the synchronous mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from helpers import cpu_devices

pytestmark = pytest.mark.usefixtures("both_modes")

BATCH = (("batch", {"batch_dims": (0,)}),)


def _recorder(log):
  def tap(arg, transforms, device):
    log.append((device.id, np.asarray(arg).tolist(), transforms))
  return tap


def _tapped(log, scale=1.0):
  return lambda v: hcb.id_tap(_recorder(log), v * scale, tap_with_device=True)


def test_jit_of_pmap():
  log = []
  devices = cpu_devices(4)
  out = jax.jit(jax.pmap(_tapped(log), devices=devices))(jnp.arange(4.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(4.))
  assert sorted(log) == [(devices[i].id, float(i), ()) for i in range(4)]


def test_vmap_of_pmap():
  log = []
  x = jnp.arange(8.).reshape(2, 2, 2)
  devices = cpu_devices(2)
  # `out` is kept: the barrier covers it.
  out = jax.vmap(jax.pmap(_tapped(log), devices=devices))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, x)
  d0, d1 = (d.id for d in devices)
  assert sorted(log) == [(d0, [[0., 1.], [4., 5.]], BATCH),
                         (d1, [[2., 3.], [6., 7.]], BATCH)]


def test_pmap_of_vmap_taps_per_device_in_order():
  log = []
  x = jnp.arange(12.).reshape(4, 3)

  def f(v):
    v = hcb.id_tap(_recorder(log), v, tap_with_device=True)
    return hcb.id_tap(_recorder(log), v + 100, tap_with_device=True)

  devices = cpu_devices(4)
  out = jax.pmap(jax.vmap(f), devices=devices)(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, x + 100)
  for i, device in enumerate(devices):
    mine = [entry for entry in log if entry[0] == device.id]
    assert mine == [(device.id, x[i].tolist(), BATCH),
                    (device.id, (x[i] + 100).tolist(), BATCH)]


def test_jvp_of_pmap_of_vmap_taps_primals_only():
  log = []
  x = jnp.arange(4.).reshape(2, 2)
  devices = cpu_devices(2)
  primal, tangent = jax.jvp(
      jax.pmap(jax.vmap(_tapped(log, 2.0)), devices=devices), (x,),
      (jnp.ones_like(x),))
  hcb.barrier_wait()
  np.testing.assert_array_equal(primal, x * 2)
  np.testing.assert_array_equal(tangent, jnp.full_like(x, 2.0))
  d0, d1 = (d.id for d in devices)
  assert sorted(log) == [(d0, [0., 2.], BATCH), (d1, [4., 6.], BATCH)]


def test_pmap_call_with_device_reports_the_executing_device():
  seen = []

  def host(arg, device):
    seen.append((device.id, int(arg)))
    return arg * 3

  devices = cpu_devices(4)
  out = jax.pmap(lambda v: hcb.call(host, v * 2, result_shape=v,
                                    call_with_device=True),
                 devices=devices)(jnp.arange(4))
  np.testing.assert_array_equal(out, [0, 6, 12, 18])
  assert sorted(seen) == [(devices[i].id, 2 * i) for i in range(4)]
