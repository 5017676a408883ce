"""The native boundary: Ctrl-C during a blocked wait, receive buffers that
host functions keep, and callback sites that are freed.

Each test runs on both transports (conftest.py), in the outfeed mode, whose
packets and receive buffers these are; those about the native library itself
skip on the Python transport and where the default backend is not CPU.
"""

import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback.host import host_side
from host_callback.receiver import native_sites

from helpers import (CTRL_C_INTERRUPTED, CTRL_C_OUTCOME, OUTFEED,
                     needs_cpu_default_backend, run_python)

_BLOCKED_CALL = CTRL_C_OUTCOME + """
import jax, jax.numpy as jnp
import host_callback as hcb

release = threading.Event()
release.set()  # until compiled

def blocked_tap(x, transforms):
  release.wait()

# The call queues behind a tap whose host function blocks: the device waits.
f = jax.jit(lambda x: hcb.call(lambda v: v + 1,
                               hcb.id_tap(blocked_tap, x), result_shape=x))
f(jnp.float32(0)).block_until_ready()
hcb.barrier_wait()
release.clear()
print("call:", outcome(lambda: f(jnp.float32(1)).block_until_ready()))
release.set()
print("after:", float(f(jnp.float32(2))))
hcb.barrier_wait()

# barrier_wait behind a blocked tap.
release.clear()
jax.jit(lambda x: hcb.id_tap(blocked_tap, x))(jnp.float32(3))
print("barrier:", outcome(hcb.barrier_wait))
release.set()
print("after:", float(f(jnp.float32(4))))
try:
  hcb.barrier_wait()
except hcb.CallbackException:
  pass
print("done")
"""


def test_ctrl_c_interrupts_a_blocked_wait(transport):
  """A device waiting for a host function that never returns: Ctrl-C gives
  the user KeyboardInterrupt on both transports (the Python transport hands
  it on past JAX's callback, which would turn it into its own error), the
  process stays usable once the host function returns, and exits cleanly."""
  process = run_python(_BLOCKED_CALL, env=OUTFEED, transport=transport)
  assert process.returncode == 0, process.stderr
  lines = process.stdout.splitlines()
  assert lines[0] in [f"call: {ended}" for ended in CTRL_C_INTERRUPTED], \
      process.stdout
  assert lines[1] == "after: 3.0", process.stdout
  assert lines[2] == "barrier: KeyboardInterrupt", process.stdout
  assert lines[3] == "after: 5.0", process.stdout
  assert lines[4] == "done", process.stdout


def test_kept_arrays_survive_later_packets(transport, outfeed_mode):
  """A host function keeps the arrays of many packets; thousands of later
  packets reuse the receive buffers only once those arrays are gone."""
  steps = 5000
  kept = []

  @jax.jit
  def loop(x):
    def body(i, _):
      hcb.id_tap(lambda v, tr: kept.append(v), (i, x + i))
      return i + 1, None
    return jax.lax.scan(body, jnp.int32(0), None, length=steps)[0]

  loop(jnp.zeros(6, jnp.int32))
  loop(jnp.full(6, 1000, jnp.int32))
  hcb.barrier_wait()
  assert len(kept) == 2 * steps
  for n, (i, v) in enumerate(kept):
    base = 0 if n < steps else 1000
    assert int(i) == n % steps
    np.testing.assert_array_equal(v, np.full(6, base + n % steps, np.int32))


@pytest.fixture
def native_only(transport):
  if transport != "native":
    pytest.skip("exercises the native library's callback sites")
  needs_cpu_default_backend("exercises the native CPU library's sites")


def _newest_site() -> int:
  return max(native_sites.sites)


def test_unregistered_site_fails_its_device(native_only, outfeed_mode):
  native = host_side.transport("native")
  taps = []
  f = jax.jit(lambda x: hcb.id_tap(lambda v, tr: taps.append(int(v)), x))
  f(1)
  hcb.barrier_wait()
  native.sites.unregister(_newest_site())
  with pytest.raises(Exception, match="site .* is not registered"):
    jax.block_until_ready(f(2))
  assert taps == [1]
  g = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=x))
  assert float(g(3.0)) == 6.0  # a new site


def test_packets_queued_for_a_freed_site_are_dropped(native_only, outfeed_mode,
                                                     caplog):
  native = host_side.transport("native")
  release = threading.Event()
  taps = []

  def blocked(v, tr):
    release.wait(30)
    taps.append(int(v))

  jax.jit(lambda x: hcb.id_tap(blocked, x))(0)  # the consumer blocks
  f = jax.jit(lambda x: hcb.id_tap(lambda v, tr: taps.append(int(v)), x))
  f(1)
  f(2)  # queued behind the blocked tap
  native.sites.unregister(_newest_site())
  with caplog.at_level(logging.ERROR, logger="host_callback"):
    release.set()
    hcb.barrier_wait()
  assert taps == [0]
  assert caplog.text.count("which was unregistered; it is dropped") == 2
  assert float(jax.jit(lambda x: hcb.call(lambda v: v + 1, x,
                                          result_shape=x))(1.0)) == 2.0
