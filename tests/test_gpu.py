"""The native transport on a CUDA GPU (receiver/native/ffi_cuda.cc): skipped
without one. `python -m tools.gpu.check` runs these first on a GPU machine,
then the whole suite with the GPU as the default backend. The host side of
the CUDA part runs on CPU in tests/test_cuda_transport.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import run_python


@pytest.fixture(autouse=True)
def native_on_gpu(transport):
  if jax.default_backend() != "gpu":
    pytest.skip("needs a CUDA GPU as the default backend")
  if transport != "native":
    pytest.skip("exercises the native transport on CUDA")
  jax.config.update("jax_host_callback_transport", "native")
  yield
  hcb.barrier_wait("gpu test teardown")


def test_taps_in_a_scan_arrive_in_order_with_their_values():
  got = []

  def step(carry, i):
    hcb.id_tap(lambda a, _: got.append((int(a[0]), float(a[1]))),
               (i, carry))
    return carry * 0.5 + 1.0, None

  jax.jit(lambda: jax.lax.scan(step, jnp.float32(0), jnp.arange(1000))[0])()
  hcb.barrier_wait()
  assert [i for i, _ in got] == list(range(1000))
  carry = np.float32(0)
  for _, value in got:
    assert value == pytest.approx(float(carry))
    carry = carry * np.float32(0.5) + np.float32(1.0)


def test_large_tap_and_call_round_trip():
  x = jnp.arange(4 << 20, dtype=jnp.float32)  # 16 MiB
  seen = []
  hcb.id_tap(lambda a, _: seen.append(float(np.asarray(a).sum())), x)
  y = jax.jit(lambda v: hcb.call(lambda a: a * 2, v,
                                 result_shape=v))(x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2)
  hcb.barrier_wait()
  assert seen == [float(np.asarray(x).sum())]


def test_host_error_is_raised_at_the_barrier():
  def fail(*_):
    raise ValueError("from the host")

  jax.jit(lambda v: hcb.id_tap(fail, v))(jnp.ones(3))
  with pytest.raises(hcb.CallbackException):
    hcb.barrier_wait()


def test_taps_in_while_predicate_body_and_cond_arrive_in_order():
  got = []

  def tap(tag):
    return lambda a, _: got.append((tag, int(a)))

  def body(i):
    i = hcb.id_tap(tap("body"), i)
    i = jax.lax.cond(i % 2 == 0, lambda v: hcb.id_tap(tap("even"), v),
                     lambda v: v, i)
    return i + 1

  jax.jit(lambda: jax.lax.while_loop(
      lambda i: hcb.id_tap(tap("pred"), i) < 6, body, 0))()
  hcb.barrier_wait()
  expected = []
  for i in range(6):
    expected += [("pred", i), ("body", i)] + [("even", i)] * (i % 2 == 0)
  assert got == expected + [("pred", 6)]



def _four_products(x, w):
  for _ in range(4):
    x = jnp.tanh(x @ w)
  return x


def test_a_tap_sees_the_work_enqueued_before_it_on_the_stream():
  """The copy waits for the matrix products before it on the stream, and
  the carry it read is overwritten only after it."""
  seen = []
  w = jax.random.normal(jax.random.key(0), (2048, 2048), jnp.float32) / 45

  def step(x, _):
    x = _four_products(x, w)
    hcb.id_tap(lambda a, _: seen.append(np.array(a)), x[:2, :3])
    return x, None

  x = jnp.ones((2048, 2048), jnp.float32)
  jax.jit(lambda v: jax.lax.scan(step, v, None, length=5)[0])(x)
  hcb.barrier_wait()
  expected = []
  for _ in range(5):
    x = jax.jit(_four_products)(x, w)
    expected.append(np.asarray(x[:2, :3]))
  assert len(seen) == 5
  for got, want in zip(seen, expected):
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


def test_tap_with_device_names_the_gpu():
  seen = []
  jax.jit(lambda v: hcb.id_tap(lambda a, _, device: seen.append(device), v,
                               tap_with_device=True))(jnp.ones(2))
  hcb.barrier_wait()
  assert seen == [jax.devices()[0]]


def test_host_functions_that_run_jax_on_the_same_gpu():
  """A call's and a tap's host functions run JAX on the GPU, in a loop where
  each call waits for the tap before it. What they run is compiled
  beforehand: while a host function blocks a GPU computation's launch (a
  call waiting for its answer), compiling for that GPU on another thread
  waits for it, with JAX's own callbacks too (seen on an H200, jax 0.11.2),
  and a tap runs on the receiver thread."""
  taps = []
  total = jax.jit(jnp.sum)

  def host(a):
    return np.asarray(jnp.sin(jnp.asarray(a)) + 1)  # on the GPU

  def step(i, x):
    x = hcb.call(host, x, result_shape=x)
    hcb.id_tap(lambda a, _: taps.append(float(total(jnp.asarray(a)))), x)
    return x

  x = jnp.arange(4, dtype=jnp.float32)
  host(np.asarray(x))  # compiles what the host functions run
  total(x)
  y = jax.jit(lambda v: jax.lax.fori_loop(0, 100, step, v))(x)
  hcb.barrier_wait()
  expected = np.arange(4, dtype=np.float32)
  sums = []
  for _ in range(100):
    expected = np.sin(expected) + 1
    sums.append(float(expected.sum()))
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5)
  np.testing.assert_allclose(taps, sums, rtol=1e-5)


def test_calls_in_a_long_scan_return_their_results():
  def step(x, _):
    return hcb.call(lambda a: a + 1, x, result_shape=x), x

  last, xs = jax.jit(lambda: jax.lax.scan(step, jnp.float32(0), None,
                                          length=2000))()
  assert float(last) == 2000
  np.testing.assert_array_equal(np.asarray(xs), np.arange(2000))


def test_a_failing_call_fails_its_computation_and_the_gpu_goes_on():
  def fail(a):
    raise ValueError("no answer")

  f = jax.jit(lambda v: hcb.call(fail, v, result_shape=v))
  with pytest.raises(Exception, match="no answer"):
    jax.block_until_ready(f(jnp.ones(3)))
  with pytest.raises(hcb.CallbackException, match="no answer"):
    hcb.barrier_wait()
  y = jax.jit(lambda v: hcb.call(lambda a: a * 3, v, result_shape=v))(
      jnp.ones(3))
  np.testing.assert_array_equal(np.asarray(y), [3, 3, 3])


def test_without_a_copy_a_tap_gets_a_read_only_view_of_the_pinned_block():
  seen = []
  x = jnp.arange(1 << 20, dtype=jnp.float32)
  jax.jit(lambda v: hcb.id_tap(
      lambda a, _: seen.append((a.flags.writeable, float(a[-1]))), v * 2,
      copy=False))(x)
  hcb.barrier_wait()
  assert seen == [(False, float((1 << 20) - 1) * 2)]


def test_many_large_taps_in_flight_under_the_smallest_queue(smallest_queue):
  """Copies in flight count against the queue's bound; none is lost."""
  got = []

  def step(x, i):
    hcb.id_tap(lambda a, _: got.append((int(a[0]), float(a[1][0]))),
               (i, x))
    return x + 1, None

  x = jnp.zeros(smallest_queue // 16, jnp.float32)  # 4 taps fill the queue
  jax.jit(lambda v: jax.lax.scan(step, v, jnp.arange(200))[0])(x)
  hcb.barrier_wait()
  assert got == [(i, float(i)) for i in range(200)]


GRAPHS_CHILD = """
import jax, jax.numpy as jnp
import host_callback as hcb

def step(x, i):
  x = jnp.tanh(x * 1.5) + jnp.cos(x)  # work that the graph captures
  hcb.id_tap(lambda a, _: print("tap", int(a)), i)
  return x, None

f = jax.jit(lambda x: jax.lax.scan(step, x, jnp.arange(10))[0])
for _ in range(5):
  x = f(jnp.ones(1024))
hcb.barrier_wait()
"""


def test_taps_between_work_in_cuda_graphs_arrive_once_and_in_order(
    transport):
  """XLA captures the work around the taps into CUDA graphs (command
  buffers) wherever it can; our handlers are not declared command-buffer
  compatible, so XLA keeps the taps out of the graphs: each replay of the
  graphs still delivers each tap once, in order."""
  flags = ("--xla_gpu_graph_min_graph_size=1 "
           "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,"
           "CONDITIONAL")
  done = run_python(GRAPHS_CHILD, env={"JAX_PLATFORMS": None,
                                       "XLA_FLAGS": flags},
                    transport=transport)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split("\n")[:-1] == [
      f"tap {i}" for _ in range(5) for i in range(10)]
