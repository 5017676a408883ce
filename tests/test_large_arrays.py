"""Large arrays: host functions own what they get, the bound holds, memory
comes back, and a 1 GiB tap and call are correct.

On the native transport a large packet (at least
`native.LARGE_PACKET_BYTES`) lies in a block of its own that the
host function's arrays view, and goes back to a pool once they are gone;
these tests check the promises that makes, on both transports (conftest.py)
and, where the path differs, in both modes; those about the queue bound in
the outfeed mode.
"""

import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback.receiver import native_library
from helpers import linux_only_calls_built, needs_cpu_default_backend

# f32[128, 1024]: 512 KiB, a large packet on the native transport.
LARGE = (128, 1024)
assert (native_library.native is None or
        4 * LARGE[0] * LARGE[1] >= native_library.native.LARGE_PACKET_BYTES)


def _rss_bytes() -> int:
  with open("/proc/self/statm") as statm:
    return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_kept_arrays_are_never_overwritten(both_modes):
  """A host function keeps arrays of many packets, large and small, while
  thousands of later packets flow; each keeps its own values."""
  kept_large, kept_small = {}, {}

  def keep_large(arg, transforms):
    step, array = arg
    if int(step) % 10 == 0:
      kept_large[int(step)] = array

  def keep_small(arg, transforms):
    index, array = arg
    if int(index) % 100 == 0:
      kept_small[int(index)] = array

  @jax.jit
  def loop(big, small):
    def body(carry, step):
      big, small = carry
      hcb.id_tap(keep_large, (step, big))
      for k in range(10):  # small packets in between
        hcb.id_tap(keep_small, (10 * step + k, small))
        small = small + 1
      return (big + 1, small), None
    return jax.lax.scan(body, (big, small), jnp.arange(300))[0]

  loop(jnp.zeros(LARGE, jnp.float32), jnp.zeros(16, jnp.int32))
  hcb.barrier_wait()
  assert sorted(kept_large) == list(range(0, 300, 10))
  for step, array in kept_large.items():
    assert array.shape == LARGE and array.flags.writeable
    np.testing.assert_array_equal(array, np.full(LARGE, step, np.float32))
  assert sorted(kept_small) == list(range(0, 3000, 100))
  for index, array in kept_small.items():
    assert array.flags.writeable
    np.testing.assert_array_equal(array, np.full(16, index, np.int32))


@pytest.mark.parametrize("shape", [(4,), LARGE], ids=["small", "large"])
def test_host_function_that_modifies_its_argument(both_modes, shape):
  """In place, as old host functions may: the call gets the original's
  result, and neither the device's array nor a later tap of it changes."""
  seen = []

  def add_one_in_place(a):
    a += 1
    return a

  def scribble(a, transforms):
    a[...] = -7  # a tap's argument is the host function's own as well
    seen.append(a)

  @jax.jit
  def f(x):
    y = hcb.call(add_one_in_place, x, result_shape=x)
    x2 = hcb.id_tap(scribble, x)
    return x, y, x2 * 2, hcb.call(add_one_in_place, x, result_shape=x)

  x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  original = np.asarray(x).copy()
  same, y, doubled, y_again = f(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(same, original)
  np.testing.assert_array_equal(x, original)
  np.testing.assert_array_equal(y, original + 1)
  np.testing.assert_array_equal(y_again, original + 1)
  np.testing.assert_array_equal(doubled, original * 2)
  assert len(seen) == 1
  np.testing.assert_array_equal(seen[0], np.full(shape, -7, np.float32))


def test_one_gib_tap_and_call_round_trip(outfeed_mode):
  """Once per transport, in the outfeed mode only (its cost): there the
  tapped 1 GiB goes through a queue whose default bound is 256 MB."""
  count = 1 << 28  # uint32: 1 GiB
  checked = []

  def check(a, transforms=None):
    assert a.shape == (count,) and a.dtype == np.uint32
    piece = 1 << 24
    for start in range(0, count, piece):
      if not np.array_equal(a[start:start + piece],
                            np.arange(start, start + piece, dtype=np.uint32)):
        checked.append(f"wrong at {start}")
        return a
    checked.append("ok")
    return a

  x = jnp.arange(count, dtype=jnp.uint32)
  jax.jit(lambda v: hcb.id_tap(check, v))(x).block_until_ready()
  hcb.barrier_wait()
  assert checked == ["ok"]
  add_one = lambda a: (check(a), a + np.uint32(1))[1]  # noqa: E731
  y = jax.jit(lambda v: hcb.call(add_one, v, result_shape=v))(x)
  assert checked == ["ok", "ok"]
  assert bool(jnp.all(y == x + 1))
  del x, y


def test_byte_bound_holds_with_large_packets(outfeed_mode, smallest_queue):
  """High water stays at most the bound plus one packet, with 4 MiB packets
  and a slow host function, in the outfeed mode."""
  bound = smallest_queue
  shape = (1024, 1024)
  packet = 4 * shape[0] * shape[1] + 64  # with the native header
  received = []

  def slow(a, transforms):
    received.append(float(a[0, 0]))
    time.sleep(0.01)

  @jax.jit
  def loop(x):
    def body(c, _):
      hcb.id_tap(slow, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=40)[0]

  loop(jnp.zeros(shape, jnp.float32))
  hcb.barrier_wait()
  assert received == [float(i) for i in range(40)]
  stats = [s for s in hcb.queue_statistics().values() if s.high_water_bytes]
  assert stats, "no queue saw the packets"
  for s in stats:
    assert s.max_bytes == bound
    assert s.high_water_bytes <= bound + packet
    assert s.bytes_waiting == 0 and s.packets_waiting == 0
  # The device did wait: without a bound 40 packets would have queued.
  assert max(s.high_water_bytes for s in stats) < 40 * packet


def test_memory_returns_when_arrays_are_dropped(both_modes, smallest_queue):
  """The resident set stays flat over 1,000 taps of 4 MiB whose arrays the
  host function drops (4 GB flow through). With the smallest queue bound,
  the queue and the native pool of free blocks stay within about 100 MB
  together; memory that did not come back would grow by 4 GB."""
  total = []

  def consume(a, transforms):
    total.append(float(a[-1, -1]))

  @jax.jit
  def loop(x):
    def body(c, _):
      hcb.id_tap(consume, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=100)[0]

  x = jnp.zeros((1024, 1024), jnp.float32)
  x = loop(x)  # warm: compiled, and the pool has its blocks
  hcb.barrier_wait()
  before = _rss_bytes()
  for _ in range(10):
    x = loop(x)
  hcb.barrier_wait()
  grown = _rss_bytes() - before
  assert total == [float(i) for i in range(1100)]
  assert grown < 160 << 20, f"the resident set grew by {grown >> 20} MiB"


def test_blocks_come_back_when_the_last_view_goes(transport, both_modes):
  """Native: a large packet's block leaves the pool while any array (or a
  view of one) that the host function got is alive, and only then."""
  if transport != "native":
    pytest.skip("the native transport's block pool")
  needs_cpu_default_backend("the native CPU transport's block pool")
  kept = []

  def keep(a, transforms):
    kept.append(a[1:3])  # a view keeps the block as well

  f = jax.jit(lambda x: hcb.id_tap(keep, x))
  x = jnp.ones(LARGE, jnp.float32)
  f(x)
  hcb.barrier_wait()
  kept.clear()
  baseline = native_library.pool_stats()["blocks_out"]
  for i in range(5):
    f(x + i)
  hcb.barrier_wait()
  # the receiver's loop may hold its last packet until the next one
  assert baseline + 4 <= native_library.pool_stats()["blocks_out"]
  np.testing.assert_array_equal(
      np.stack(kept), np.stack([np.full((2, LARGE[1]), 1 + i, np.float32)
                                for i in range(5)]))
  kept.clear()
  assert native_library.pool_stats()["blocks_out"] <= baseline + 1


def _advised_huge_pages(start: int, nbytes: int) -> bool:
  """Whether the mapping that holds the middle of a buffer is advised
  transparent huge pages (VmFlags "hg" in /proc/self/smaps); the advice
  covers its whole pages, so not the first, partial one."""
  address = start + nbytes // 2
  inside = False
  with open("/proc/self/smaps") as smaps:
    for line in smaps:
      fields = line.split()
      if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        inside = low <= address < high
      elif inside and fields[0] == "VmFlags:":
        return "hg" in fields[1:]
  raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("buffers", [False, True], ids=["copied", "out="])
def test_large_call_results_are_written_into_huge_pages(transport, both_modes,
                                                        buffers):
  """A call's result buffers of 4 MiB and more are advised huge pages, as
  NumPy advises its own arrays, before the native transport or the host
  function (out=) writes them: a write into XLA's fresh buffer then faults
  once per 2 MiB, not per 4 KiB (half a 256 MiB call's time otherwise)."""
  if transport != "native":
    pytest.skip("the Python transport's results are written by JAX")
  needs_cpu_default_backend("the CPU's result buffers are host memory")
  if not linux_only_calls_built():
    pytest.skip("the portable build advises no huge pages")
  if not os.path.exists("/sys/kernel/mm/transparent_hugepage"):
    pytest.skip("this kernel has no transparent huge pages")
  filled = []

  def fill(a, out):
    filled.append(_advised_huge_pages(out.ctypes.data, out.nbytes))
    np.copyto(out, a)

  # 64 MiB: above glibc's largest mmap threshold, so the result is a
  # mapping of its own that nothing else advised.
  x = jnp.ones((16, 1024, 1024), jnp.float32)
  if buffers:
    call = lambda v: hcb.call(fill, v, result_shape=v, buffers=True)  # noqa: E731
  else:
    call = lambda v: hcb.call(lambda a: a + 1, v, result_shape=v)  # noqa: E731
  out = jax.jit(call)(x)
  hcb.barrier_wait()
  assert _advised_huge_pages(out.unsafe_buffer_pointer(), out.nbytes)
  assert filled == ([True] if buffers else [])
  np.testing.assert_array_equal(out[:, 0, 0], 1.0 if buffers else 2.0)
