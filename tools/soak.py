"""Soak test: a mixed host_callback workload for a given duration.

    python -m tools.soak --minutes 10 [--transport native|python]
        [--threads N]
    python -m tools.soak --chaos --seconds 60 [--seed N]  (see tools/chaos.py)

Four Python threads (`--threads`) run, each on its own device where there
are enough (4 CPU devices are forced; a GPU machine's default backend may
have one, which the threads then share), each cycling through: a
1,000-step scan of sequence-numbered scalar taps, a 100-step scan of
f32[1000] taps, a 100-step scan of `call`s, and a single tap timed from
dispatch to consumer (latency). At the end it prints how many taps
were delivered, lost and reordered, tap latency p50/p99, and peak RSS.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import threading
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import host_callback as hcb  # noqa: E402

from . import chaos  # noqa: E402

SCALAR_STEPS, ARRAY_STEPS, CALL_STEPS = 1000, 100, 100


class Ledger:
  """What was sent and received, per (device, stream); `lock` guards all.

  Each stream's values are 0, 1, 2, ... in order, so checking a value needs
  only the next one expected: the ledger's memory stays constant.
  """

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.sent = collections.Counter()
    self.received = collections.Counter()
    self.next_expected = collections.Counter()
    self.reordered = 0
    self.latencies: list[float] = []
    self.dispatch_times: dict[int, float] = {}
    self.call_errors = 0

  def tap(self, stream: str):
    """A tap function that checks `stream`'s values on each device."""
    def consume(arg, transforms, device):
      value = int(np.asarray(arg).flat[0])
      key = (device.id, stream)
      with self.lock:
        self.received[key] += 1
        if value != self.next_expected[key]:
          self.reordered += 1
        self.next_expected[key] = value + 1
    return consume

  def latency_tap(self, arg, transforms):
    now = time.perf_counter()
    with self.lock:
      self.latencies.append(now - self.dispatch_times.pop(int(arg)))


def _programs(ledger: Ledger, index: int):
  """The jitted programs of thread `index`, whose taps are its own
  streams."""
  def scan_of(op, steps):
    return jax.jit(lambda x: jax.lax.scan(lambda c, _: (op(c) + 1, None), x,
                                          None, length=steps)[0])
  scalar = scan_of(lambda c: hcb.id_tap(ledger.tap(f"scalar{index}"), c,
                                        tap_with_device=True), SCALAR_STEPS)
  array = scan_of(lambda c: hcb.id_tap(ledger.tap(f"array{index}"), c,
                                       tap_with_device=True), ARRAY_STEPS)
  calls = scan_of(lambda c: hcb.call(lambda a: a, c, result_shape=c),
                  CALL_STEPS)
  latency = jax.jit(lambda x: hcb.id_tap(ledger.latency_tap, x))
  return scalar, array, calls, latency


def _worker(ledger: Ledger, device, index: int, deadline: float) -> None:
  scalar, array, calls, latency = _programs(ledger, index)
  cycle = 0
  while time.monotonic() < deadline:
    base = cycle * SCALAR_STEPS
    scalar(jax.device_put(jnp.int32(base), device))
    array(jax.device_put(jnp.full(1000, cycle * ARRAY_STEPS, jnp.int32), device))
    out = calls(jax.device_put(jnp.int32(0), device))
    if int(out) != CALL_STEPS:
      with ledger.lock:
        ledger.call_errors += 1
    key = index * 100_000_000 + cycle  # fits in int32
    with ledger.lock:
      ledger.dispatch_times[key] = time.perf_counter()
    latency(jax.device_put(jnp.int32(key), device))
    with ledger.lock:
      ledger.sent[(device.id, f"scalar{index}")] += SCALAR_STEPS
      ledger.sent[(device.id, f"array{index}")] += ARRAY_STEPS
    cycle += 1


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--minutes", type=float, default=10.0)
  parser.add_argument("--transport", choices=["auto", "native", "python"],
                      default="auto")
  parser.add_argument("--chaos", action="store_true",
                      help="inject faults and check the outcome "
                      "(tools/chaos.py); exits 1 on any violation")
  parser.add_argument("--seconds", type=float,
                      help="the duration, instead of --minutes")
  parser.add_argument("--seed", type=int, default=0, help="for --chaos")
  parser.add_argument("--taps-per-step", type=int,
                      default=chaos.TAPS_PER_STEP,
                      help="for --chaos: taps in each jitted step")
  parser.add_argument("--threads", type=int, default=4,
                      help="threads of taps, over the default backend's "
                      "devices in turn")
  options = parser.parse_args()
  seconds = (options.seconds if options.seconds is not None
             else 60 * options.minutes)
  if options.chaos:
    sys.exit(chaos.main(seconds, options.seed, options.transport,
                        options.taps_per_step))
  jax.config.update("jax_host_callback_transport", options.transport)
  ledger = Ledger()
  deadline = time.monotonic() + seconds
  devices = jax.devices()
  threads = [threading.Thread(target=_worker, args=(
      ledger, devices[i % len(devices)], i, deadline))
             for i in range(options.threads)]
  start = time.monotonic()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  hcb.barrier_wait()
  elapsed = time.monotonic() - start
  delivered = sum(ledger.received.values())
  lost = sum(max(0, count - ledger.received[key])
             for key, count in ledger.sent.items())
  reordered = ledger.reordered
  latencies = np.array(ledger.latencies) * 1e6
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"transport={options.transport} duration={elapsed:.0f}s "
        f"devices={min(len(devices), options.threads)} "
        f"threads={options.threads} ({devices[0].platform})")
  print(f"taps delivered={delivered} lost={lost} reordered={reordered} "
        f"call_errors={ledger.call_errors}")
  print(f"tap latency (dispatch to consumer): p50={np.percentile(latencies, 50):.0f}µs "
        f"p99={np.percentile(latencies, 99):.0f}µs over {len(latencies)} taps")
  print(f"peak RSS={peak_mib:.0f} MiB")
  sys.exit(1 if lost or reordered or ledger.call_errors else 0)


if __name__ == "__main__":
  main()
