"""Host functions that run JAX code calling the host again (`hcb.call` or
`hcb.id_tap` inside a tap function or a call's host function).

Each test runs on both transports and in both modes (but the one about the
outfeed mode's limit on native); a nested call runs its
host function on the thread that runs the outer one, or is answered by the
device's consumer, and never deadlocks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

# A hang would be inside a host callback, where the default (signal) method
# cannot interrupt it: the thread method ends the run instead.
pytestmark = pytest.mark.timeout(60, method="thread")


@pytest.fixture
def on_a_consumer_thread(transport, both_modes):
  """Runs the test in both modes: in the outfeed mode the outer host
  function runs on the device's consumer thread (an asynchronous tap, or a
  call queued behind one)."""
  del transport, both_modes  # set first


def _plus_one(x):
  return x + 1


_inner_call = jax.jit(lambda v: hcb.call(_plus_one, v, result_shape=v))


def test_call_inside_a_tap_function(on_a_consumer_thread):
  got = []

  def tap(x, transforms):
    got.append(np.asarray(_inner_call(x * 10)).tolist())

  out = jax.jit(lambda x: hcb.id_tap(tap, x) * 2)(jnp.arange(3.))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0., 2., 4.])
  assert got == [[1., 11., 21.]]


def test_call_from_a_tap_function_keeps_the_devices_order(transport,
                                                          outfeed_mode):
  """In the outfeed mode a tap function runs on the device's receiver
  thread; a call its JAX code makes of the same device is served by that
  thread (on native too), after the taps the device sent before it."""
  log = []

  def tap(x, transforms):
    log.append(("outer", float(x)))
    if float(x) == 0:
      log.append(("inner result", float(_inner_call(x + 100))))

  f = jax.jit(lambda x: hcb.id_tap(tap, x))
  for i in range(3):
    f(float(i))
  hcb.barrier_wait()
  assert log == [("outer", 0.0), ("outer", 1.0), ("outer", 2.0),
                 ("inner result", 101.0)] or log == [
                     ("outer", 0.0), ("inner result", 101.0), ("outer", 1.0),
                     ("outer", 2.0)]
  assert float(_inner_call(1.)) == 2.  # and the device goes on


def test_call_inside_a_call(both_modes):
  def host(x):
    return np.asarray(_inner_call(x)) * 10

  out = jax.jit(lambda x: hcb.call(host, x, result_shape=x) + 1)(2.)
  assert float(out) == 31.


def test_calls_nested_three_deep_under_a_tap(on_a_consumer_thread):
  def middle(x):
    return np.asarray(_inner_call(x)) * 10

  middle_call = jax.jit(lambda v: hcb.call(middle, v, result_shape=v))
  got = []

  def tap(x, transforms):
    got.append(float(middle_call(x)))

  out = jax.jit(lambda x: hcb.id_tap(tap, x) + 1)(1.)
  hcb.barrier_wait()
  assert float(out) == 2. and got == [20.]


def test_nested_tap_then_call_keep_their_order(on_a_consumer_thread):
  """The nested tap reaches the host before the nested call that follows
  it, whichever thread runs each."""
  log = []

  def record(name):
    def tap(x, transforms):
      log.append((name, float(x)))
    return tap

  @jax.jit
  def inner(v):
    v = hcb.id_tap(record("inner tap"), v)
    return hcb.call(lambda a: (log.append(("inner call", float(a))), a * 3)[1],
                    v, result_shape=v)

  def host(x):
    log.append(("outer call", float(x)))
    return np.asarray(inner(x + 1))

  out = jax.jit(lambda x: hcb.call(
      host, hcb.id_tap(record("outer tap"), x), result_shape=x))(1.)
  hcb.barrier_wait()
  assert float(out) == 6.
  assert log == [("outer tap", 1.), ("outer call", 1.), ("inner tap", 2.),
                 ("inner call", 2.)]


def test_error_in_a_nested_call_reaches_the_outer_host_function(both_modes):
  def bad(x):
    raise ValueError("inner boom")

  failing = jax.jit(lambda v: hcb.call(bad, v, result_shape=v))
  caught = []

  def host(x):
    try:
      jax.block_until_ready(failing(x))
    except Exception as error:  # pylint: disable=broad-except
      caught.append(str(error))
    return x

  out = jax.jit(lambda x: hcb.call(host, x, result_shape=x))(4.)
  assert float(out) == 4.
  assert len(caught) == 1 and "bad raised ValueError: inner boom" in caught[0]
  if both_modes == "outfeed":  # the synchronous mode raises it once
    with pytest.raises(hcb.CallbackException, match="inner boom"):
      hcb.barrier_wait()
  hcb.barrier_wait()


@pytest.mark.parametrize("outer", ["tap", "call"])
def test_nested_taps_beyond_the_queue_bound(transport, both_modes, outer,
                                            smallest_queue):
  """A host function whose JAX code taps more than the bound on its own
  device goes on: it does not wait for room that only it could make."""
  if transport == "native" and both_modes == "outfeed":
    # DeviceQueue::Push waits for room while the device runs a host function
    # directly (the consumer takes nothing), or on the consumer thread.
    pytest.skip("native: a host function's taps wait for room that only "
                "they could make")
  count = 5000  # of 4 KB each, more than the bound
  got = []

  @jax.jit
  def taps(x):
    def body(c, _):
      hcb.id_tap(lambda v, tr: got.append(float(v[0])),
                 jnp.full(1000, x + c))
      return c + 1, None
    return jax.lax.scan(body, 0., None, length=count)[0]

  def host(x, *unused):
    assert float(taps(x)) == count
    return x

  x = jnp.float32(10.)
  if outer == "tap":
    jax.jit(lambda v: hcb.id_tap(host, v))(x)
  else:
    assert float(jax.jit(lambda v: hcb.call(host, v, result_shape=v))(x)) == 10.
  hcb.barrier_wait()
  hcb.barrier_wait()  # nested outfeed taps may be queued behind the marker
  assert got == [10. + i for i in range(count)]
