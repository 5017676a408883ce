"""Load and backpressure: every tap delivered exactly once, in order, bounded memory.

Every test here runs in the outfeed mode, whose queues take the load.
"""

import collections
import json
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import OUTFEED, Recorder, cpu_devices, run_python

pytestmark = pytest.mark.usefixtures("outfeed_mode")


def _scan_of_taps(tap, steps):
  def body(carry, _):
    seq, value = carry
    hcb.id_tap(tap, (seq, value))
    return (seq + 1, value + 1), None
  return jax.jit(lambda c: jax.lax.scan(body, c, None, length=steps)[0])


def test_a_million_scalar_taps_in_order():
  steps = 1_000_000
  seqs = np.empty(steps, np.int64)
  total = [0.0, 0]

  def tap(arg, transforms):
    seq, value = arg
    seqs[total[1]] = seq
    total[0] += float(value)
    total[1] += 1

  _scan_of_taps(tap, steps)((jnp.int32(0), jnp.float32(0.5)))
  hcb.barrier_wait()
  assert total[1] == steps
  np.testing.assert_array_equal(seqs, np.arange(steps))
  assert total[0] == np.sum(np.arange(steps, dtype=np.float64) + 0.5)


def test_ten_thousand_array_taps_with_checksum():
  steps = 10_000
  sums = []

  def tap(arg, transforms):
    seq, value = arg
    sums.append((int(seq), float(value.sum(dtype=np.float64))))

  base = jnp.arange(1000, dtype=jnp.float32)
  _scan_of_taps(tap, steps)((jnp.int32(0), base))
  hcb.barrier_wait()
  expected_base = float(np.arange(1000).sum())
  assert sums == [(i, expected_base + 1000.0 * i) for i in range(steps)]


def test_four_devices_four_threads_for_a_bounded_time():
  tap = Recorder()
  lock = threading.Lock()

  @jax.jit
  def run(start):
    return jax.lax.scan(
        lambda c, _: (hcb.id_tap(tap, c, tap_with_device=True) + 1, None),
        start, None, length=100)[0]

  deadline = time.monotonic() + 2.0
  sent = collections.Counter()
  def dispatch(device, thread_index):
    calls, outputs = 0, []
    while time.monotonic() < deadline:
      # Each thread owns a disjoint range of sequence numbers.
      outputs.append(run(jax.device_put(
          np.int32(thread_index * 10_000_000 + calls * 100), device)))
      calls += 1
    # What a barrier covers of other threads' computations: those begun.
    jax.block_until_ready(outputs)
    with lock:
      sent[device.id] += calls * 100

  threads = [threading.Thread(target=dispatch, args=(device, 4 * d + t))
             for d, device in enumerate(cpu_devices(4)) for t in range(4)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  hcb.barrier_wait()
  received = tap.by_device()
  for device in cpu_devices(4):
    values = received[device.id]
    assert len(values) == sent[device.id]
    # Per thread (range of sequence numbers), the device kept the order.
    by_thread = collections.defaultdict(list)
    for v in values:
      by_thread[v // 10_000_000].append(v)
    for seq in by_thread.values():
      assert seq == sorted(seq) and len(seq) == len(set(seq))


def test_256_mib_tap_and_call_round_trip():
  x = jnp.ones((64, 1024, 1024), jnp.float32)  # 256 MiB
  seen = []
  jax.jit(lambda v: hcb.id_tap(
      lambda a, _: seen.append((a.shape, float(a[::7, ::13, ::17].sum()))),
      v * 2))(x).block_until_ready()
  out = jax.jit(lambda v: hcb.call(lambda a: a + 1, v, result_shape=v))(x)
  hcb.barrier_wait()
  assert seen == [((64, 1024, 1024), 2.0 * x[::7, ::13, ::17].size)]
  assert out.shape == x.shape and float(out[63, 1023, 1023]) == 2.0
  assert float(out.sum(dtype=jnp.float32)) == 2.0 * x.size


def test_backpressure_bounds_queue_and_memory(transport):
  code = textwrap.dedent("""
      import json, threading, time
      import jax, jax.numpy as jnp
      import host_callback as hcb

      def rss():
        with open("/proc/self/status") as f:
          for line in f:
            if line.startswith("VmRSS:"):
              return int(line.split()[1]) * 1024

      received, peaks = [], {"rss": 0, "bytes": 0, "packet": 4_000_000}
      def slow(x, transforms):
        time.sleep(0.01)
        received.append(int(x[0]))
        for stats in hcb.queue_statistics().values():
          peaks["bytes"] = max(peaks["bytes"], stats.high_water_bytes)
        peaks["rss"] = max(peaks["rss"], rss())

      run = jax.jit(lambda x: jax.lax.scan(
          lambda c, _: (hcb.id_tap(slow, c) + 1, None), x, None,
          length=100)[0])
      x = jnp.zeros(1_000_000, jnp.int32)   # 4 MB a tap, 400 MB in all
      run(x).block_until_ready(); hcb.barrier_wait()   # compile, warm up
      received.clear(); start_rss = rss(); peaks["rss"] = start_rss
      run(x + 1000).block_until_ready()
      hcb.barrier_wait()
      print(json.dumps({"in_order": received == list(range(1000, 1100)),
                        "rss_growth": peaks["rss"] - start_rss,
                        "high_water": peaks["bytes"]}))
      """)
  done = run_python(
      code,
      env={**OUTFEED, "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16000000"},
      transport=transport, timeout=180)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["in_order"]
  assert 0 < result["high_water"] <= 16_000_000 + 4_000_000
  assert result["rss_growth"] < 150_000_000, result
