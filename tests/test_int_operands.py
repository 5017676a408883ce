"""`api.consumer_tap`'s `int_operands`: the int32 scalars it names come to
the consumer as Python ints on every path a packet takes (the direct run
of the synchronous mode, a queued packet alone or in a batch of the
outfeed mode, on each transport); the other operands, and a named one that
`vmap` batched, stay arrays. A loop tap's step comes so (host_callback.loops);
the receiver's side of it is a site's `int_columns`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import api
from host_callback.receiver import native_library
from host_callback.receiver.transport import int_flags

pytestmark = pytest.mark.usefixtures("both_modes")


def _tap(consume, *operands):
  """Taps `operands` to the consumer `consume`, whose first one is named."""
  api.consumer_tap(consume, [jnp.asarray(o) for o in operands],
                   context=lambda: "test_int_operands", int_operands=(0,))


def _received(got):
  """A consumer that records (type, value) of each operand it gets."""
  def consume(arrays, device_id, transforms=()):
    del device_id, transforms
    got.append([(type(a), np.asarray(a).tolist()) for a in arrays])
  return consume


def test_a_named_int32_scalar_comes_as_an_int_in_a_batch_of_packets():
  got = []

  def body(carry, _):
    _tap(_received(got), carry, jnp.float32(carry) * 2, carry)
    return carry + 1, None

  jax.jit(lambda: jax.lax.scan(body, jnp.int32(-3), None, length=30))()
  hcb.barrier_wait()
  assert got == [[(int, s), (np.ndarray, 2.0 * s), (np.ndarray, s)]
                 for s in range(-3, 27)]


def test_a_named_int32_scalar_comes_as_an_int_in_a_packet_alone():
  got = []
  jax.jit(lambda x: _tap(_received(got), x, x))(jnp.int32(2**31 - 1))
  hcb.barrier_wait()
  assert got == [[(int, 2**31 - 1), (np.ndarray, 2**31 - 1)]]


def test_a_named_operand_that_vmap_batched_stays_an_array():
  got = []

  def consume(arrays, device_id, transforms=()):
    del device_id
    got.append((type(arrays[0]), np.asarray(arrays[0]).tolist(),
                [name for name, _ in transforms]))

  jax.jit(jax.vmap(lambda x: _tap(consume, x)))(jnp.arange(3, dtype=jnp.int32))
  hcb.barrier_wait()
  assert got == [(np.ndarray, [0, 1, 2], ["batch"])]


@pytest.mark.parametrize("dtype, shape", [(np.int64, ()), (np.float32, ()),
                                          (np.int32, (1,))])
def test_only_an_int32_scalar_may_be_named(dtype, shape):
  with pytest.raises(ValueError, match="array 1, which is not an int32 scalar"):
    int_flags([1], [np.int32, dtype], [(), shape])
  assert int_flags([0], [np.int32, dtype], [(), shape]) == (True, False)


def test_the_direct_runner_s_copy_of_a_site_names_its_ints(transport):
  if transport != "native" or not native_library.available():
    pytest.skip("the native module's site table")
  from host_callback.receiver import native_sites
  native = native_library.native
  site_id = native_sites.register_site(
      10**9, [np.float32, np.int32, np.int32], [(), (), (2,)], name="ints",
      copy=True, packed_results=False, buffers=False, int_columns=[1])
  try:
    assert native_sites.sites[site_id].ints == (False, True, False)
    assert native._testing_runner_site(site_id)[4] == [False, True, False]
  finally:
    native_sites.sites.unregister(site_id)
  with pytest.raises(ValueError, match="only an int32 scalar comes as an int"):
    native.register_site(site_id + 10**6, [8], 10**9, "bad", [np.int64], [()],
                         [None], [True], True, False, False)
