"""Chaos soak: the soak's workload with faults injected at random, checked.

    python -m tools.soak --chaos --seconds 60 [--transport ...] [--seed N]
        [--taps-per-step N]

Rounds until the time is up. Each round picks a mode (outfeed or
synchronous) and maybe the smallest queue bound; four threads, one per CPU
device, run jitted steps (a `fori_loop` of sequence-numbered taps, then a
`call`) whose tap functions raise `Exception` or `KeyboardInterrupt` at
planned steps, while the main thread may stop the receiver. Then the main
thread takes a Ctrl-C (a real SIGINT) while it waits in `barrier_wait` or
in a `call`, and every few rounds a child process exits with taps in
flight, or is interrupted at exit with a tap blocked. After each round it
checks the rule of the user guide ("Ctrl-C and `KeyboardInterrupt`"):

- every tap that should have run ran once, in program order per device (in
  the synchronous mode a tap that raises stops its step);
- every error was reported once, where the rule says (the failed step in
  the synchronous mode; the round's barrier in the outfeed mode, and no
  later one), and an interrupt never;
- no wait outlived its bound;
- memory returned to its level (resident set at the end against after the
  first rounds).

It prints the counts and exits 1 on any violation.
"""

from __future__ import annotations

import collections
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp

import host_callback as hcb
from host_callback import settings

DEVICES, TAPS_PER_STEP, STEPS_PER_ROUND = 4, 50, 6
WAIT_BOUND_SECONDS = 30.0  # for any wait; an interrupted one: 3 s
MEMORY_BOUND_MIB = 256.0


class ChaosError(Exception):
  """What a tap function raises when the plan says `Exception`."""


class Counts:
  """What happened and what went wrong; `lock` guards `counts`."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.counts: Dict[str, int] = collections.Counter(
        {name: 0 for name in ("lost", "duplicated", "reordered", "hung",
                              "violations")})

  def add(self, name: str, count: int = 1) -> None:
    with self.lock:
      self.counts[name] += count

  def violation(self, what: str) -> None:
    print(f"VIOLATION: {what}", flush=True)
    self.add("violations")


def _rss_mib() -> float:
  with open("/proc/self/statm") as statm:
    return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Round:
  """One round's plan (the faults, by device and sequence number) and what
  the tap functions saw; `lock` guards `seen`."""

  def __init__(self, rng: random.Random, outfeed: bool) -> None:
    self.outfeed = outfeed
    self.lock = threading.Lock()
    self.seen: Dict[int, List[int]] = collections.defaultdict(list)
    self.faults: Dict[Tuple[int, int], type] = {}
    for device in range(DEVICES):
      for step in range(STEPS_PER_ROUND):
        if rng.random() < 0.3:
          kind = rng.choice([ChaosError, KeyboardInterrupt])
          sequence = step * TAPS_PER_STEP + rng.randrange(TAPS_PER_STEP)
          self.faults[(device, sequence)] = kind

  def tap(self, value: Any, transforms: Any, device: Any) -> None:
    del transforms
    sequence = int(value)
    with self.lock:
      self.seen[device.id].append(sequence)
    fault = self.faults.get((device.id, sequence))
    if fault is not None:
      raise fault(f"planned fault at {sequence} on device {device.id}")

  def expected(self, device: int) -> List[int]:
    """The taps that must run on `device`, in order."""
    taps = []
    for step in range(STEPS_PER_ROUND):
      for sequence in range(step * TAPS_PER_STEP, (step + 1) * TAPS_PER_STEP):
        taps.append(sequence)
        if not self.outfeed and (device, sequence) in self.faults:
          break  # the synchronous mode: the failed step stops
    return taps


def _step(function: Callable) -> Callable:
  """A jitted step: TAPS_PER_STEP taps numbered from its input, then a
  `call` that returns its argument plus one."""
  def body(i, start):
    return hcb.id_tap(function, start + i, result=start, tap_with_device=True)
  return jax.jit(lambda start: hcb.call(
      lambda s: s + 1, jax.lax.fori_loop(0, TAPS_PER_STEP, body, start),
      result_shape=start))


def _worker(chaos: Round, step: Callable, device: Any, counts: Counts) -> None:
  for index in range(STEPS_PER_ROUND):
    start = index * TAPS_PER_STEP
    planned = [chaos.faults.get((device.id, s))
               for s in range(start, start + TAPS_PER_STEP)]
    began = time.monotonic()
    try:
      result = int(step(jax.device_put(jnp.int32(start), device)))
      failed = None
    except Exception as error:  # pylint: disable=broad-except
      result, failed = None, error
    if time.monotonic() - began > WAIT_BOUND_SECONDS:
      counts.add("hung")
      counts.violation(f"a step waited {time.monotonic() - began:.0f} s")
    fault = next((kind for kind in planned if kind is not None), None)
    if chaos.outfeed or fault is None:
      if failed is not None or result != start + 1:
        counts.violation(f"step {index} on {device}: {result!r} {failed!r}")
    elif failed is None or fault.__name__ not in str(failed):
      counts.violation(f"step {index} on {device} did not fail with "
                       f"{fault.__name__}: {failed!r}")
    else:
      counts.add("errors reported by their step")


def _barrier_report() -> str:
  """'nothing', or the name of the error a CallbackException chains."""
  try:
    hcb.barrier_wait()
    return "nothing"
  except hcb.CallbackException as error:
    return type(error.__cause__).__name__


def run_round(rng: random.Random, counts: Counts) -> None:
  """One round of workers with faults, then its checks."""
  outfeed = rng.random() < 0.5
  tiny_queue = rng.random() < 0.2
  if tiny_queue:
    hcb.stop_outfeed_receiver()  # the bound applies to a new receiver
    jax.config.update("jax_host_callback_max_queue_byte_size",
                      settings.MIN_QUEUE_BYTES)
    counts.add("rounds with the smallest queue")
  jax.config.update("jax_host_callback_outfeed", outfeed)
  chaos = Round(rng, outfeed)
  step = _step(chaos.tap)
  threads = [threading.Thread(target=_worker,
                              args=(chaos, step, device, counts))
             for device in jax.devices("cpu")[:DEVICES]]
  for thread in threads:
    thread.start()
  if rng.random() < 0.3:
    time.sleep(rng.random() * 0.05)
    hcb.stop_outfeed_receiver()
    counts.add("receiver stops")
  for thread in threads:
    thread.join(WAIT_BOUND_SECONDS * STEPS_PER_ROUND)
    if thread.is_alive():
      counts.add("hung")
      counts.violation("a worker hung")
  report = _barrier_report()
  faults = len(chaos.faults)
  counts.add("faults injected (raise)", faults)
  if outfeed and faults:
    if report not in ("ChaosError", "KeyboardInterrupt"):
      counts.violation(f"the barrier reported {report} after {faults} faults")
    else:
      counts.add("errors reported by the barrier")
  elif report != "nothing":
    counts.violation(f"the barrier reported {report} (nothing expected)")
  if _barrier_report() != "nothing":
    counts.violation("a second barrier reported an error again")
  for device in range(DEVICES):
    expected, seen = chaos.expected(device), chaos.seen[device]
    counts.add("taps", len(seen))
    lost = len(set(expected) - set(seen))
    counts.add("lost", lost)
    counts.add("duplicated", len(seen) - len(set(seen)))
    counts.add("reordered", int(seen != sorted(seen)))
    if lost or seen != expected:
      counts.violation(f"device {device}: {len(seen)} taps, {lost} lost, "
                       f"expected {len(expected)} in order")
  if tiny_queue:
    hcb.stop_outfeed_receiver()
    jax.config.update("jax_host_callback_max_queue_byte_size",
                      settings.DEFAULT_QUEUE_BYTES)


def _interrupted(wait: Callable[[], Any], after: float) -> Tuple[str, float]:
  """Runs `wait()` on the main thread with a SIGINT sent `after` seconds
  in; returns how it ended and how long after the SIGINT."""
  sent = [0.0]

  def interrupt() -> None:
    sent[0] = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)

  timer = threading.Timer(after, interrupt)
  try:
    try:
      timer.start()
      try:
        wait()
        ended = "returned"
      except KeyboardInterrupt:
        ended = "KeyboardInterrupt"
      except Exception as error:  # pylint: disable=broad-except
        ended = f"error naming it: {'KeyboardInterrupt' in str(error)}"
      timer.join()
      time.sleep(0.2)  # a re-armed interrupt lands here at the latest
    except KeyboardInterrupt:
      ended = "KeyboardInterrupt, late"
  except KeyboardInterrupt:  # pragma: no cover (a third one)
    ended = "KeyboardInterrupt, later"
  return ended, time.monotonic() - sent[0]


def interrupt_the_main_thread(rng: random.Random, counts: Counts) -> None:
  """A SIGINT while the main thread waits in barrier_wait (behind a slow
  tap, outfeed mode) or in a slow `call`: the wait ends, and no barrier
  reports the interrupt."""
  in_barrier = rng.random() < 0.5
  jax.config.update("jax_host_callback_outfeed", in_barrier)
  ran = []

  def slow(value, *rest):
    time.sleep(0.5)
    ran.append(int(value))
    return value

  wait: Callable[[], Any]
  if in_barrier:
    jax.jit(lambda x: hcb.id_tap(slow, x))(jnp.int32(1))
    wait = hcb.barrier_wait
  else:
    call = jax.jit(lambda x: hcb.call(slow, x, result_shape=x))
    wait = lambda: call(jnp.int32(1)).block_until_ready()  # noqa: E731
  ended, seconds = _interrupted(wait, after=0.05 + 0.3 * rng.random())
  counts.add("SIGINTs")
  if ended == "returned" or ended == "error naming it: False":
    counts.violation(f"a SIGINT in {wait} did not interrupt it: {ended}")
  if seconds > 3.0:
    counts.add("hung")
    counts.violation(f"an interrupted wait lasted {seconds:.1f} s more")
  if _barrier_report() != "nothing":
    counts.violation("a barrier reported an interrupt")
  if len(ran) > 1:  # none when Ctrl-C stopped it (run by the barrier)
    counts.violation(f"the interrupted tap or call ran {len(ran)} times")


_CHILD = """
import atexit, threading, time, jax, jax.numpy as jnp, host_callback as hcb
ran = []
atexit.register(lambda: print("ran", len(ran), flush=True))  # after the drain
def tap(value, transforms):
  if BLOCK:
    threading.Event().wait()
  time.sleep(0.0005)
  ran.append(int(value))
step = jax.jit(lambda x: jax.lax.fori_loop(
    0, 100, lambda i, c: hcb.id_tap(tap, c + i, result=c), x))
for start in range(0, 1000, 100):
  step(jnp.int32(start))
atexit.register(print, "exiting", flush=True)  # right before the drain
"""


def exit_a_child(rng: random.Random, counts: Counts, transport: str) -> None:
  """A child ends with 1,000 taps in flight (all run by its drain), or
  with a tap blocked for ever and a SIGINT during its drain (it exits)."""
  block = rng.random() < 0.3
  env = dict(os.environ, JAX_HOST_CALLBACK_OUTFEED="1",
             JAX_HOST_CALLBACK_TRANSPORT=transport)
  child = subprocess.Popen(
      [sys.executable, "-c", f"BLOCK = {block}\n" + _CHILD], env=env,
      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert child.stdout is not None
  try:
    if block:
      if not select.select([child.stdout], [], [], WAIT_BOUND_SECONDS)[0]:
        raise subprocess.TimeoutExpired(child.args, WAIT_BOUND_SECONDS)
      child.stdout.readline()  # "exiting": the drain begins
      time.sleep(0.3)
      child.send_signal(signal.SIGINT)
      counts.add("SIGINTs at exit")
    stdout, stderr = child.communicate(
        timeout=10 if block else WAIT_BOUND_SECONDS)
  except subprocess.TimeoutExpired:
    counts.add("hung")
    counts.violation(f"a child hung at exit (blocked: {block})")
    return
  finally:
    child.kill()
  counts.add("children exited with work in flight")
  if block:
    if "Ctrl-C ended the drain at exit" not in stderr:
      counts.violation(f"an interrupted child said: {stderr[-500:]}")
  elif stdout.split() != ["exiting", "ran", "1000"] or child.returncode:
    counts.violation(f"a child's drain: {stdout!r} {stderr[-500:]}")


def main(seconds: float, seed: int, transport: str,
         taps_per_step: int = TAPS_PER_STEP) -> int:
  """Runs the chaos soak, with `taps_per_step` taps in each step (more
  taps per fault for a long run); returns the exit status."""
  global TAPS_PER_STEP  # pylint: disable=global-statement
  TAPS_PER_STEP = taps_per_step
  # Python leaves SIGINT ignored where it started ignored (a command run in
  # the background by a shell): the soak's own SIGINTs must raise.
  signal.signal(signal.SIGINT, signal.default_int_handler)
  jax.config.update("jax_host_callback_transport", transport)
  rng = random.Random(seed)
  counts = Counts()
  deadline = time.monotonic() + seconds
  baseline = None
  rounds = 0
  while time.monotonic() < deadline or rounds < 3:
    run_round(rng, counts)
    interrupt_the_main_thread(rng, counts)
    if rounds % 4 == 0:
      exit_a_child(rng, counts, transport)
    rounds += 1
    if rounds == 3:
      baseline = _rss_mib()
  jax.config.update("jax_host_callback_outfeed", False)
  grown = _rss_mib() - (baseline or 0.0)
  if grown > MEMORY_BOUND_MIB:
    counts.violation(f"memory grew {grown:.0f} MiB after the first rounds")
  print(f"chaos: transport={transport} seed={seed} rounds={rounds} "
        f"seconds={seconds:.0f} memory growth={grown:.0f} MiB", flush=True)
  for name, count in sorted(counts.counts.items()):
    print(f"  {name}: {count}", flush=True)
  return 1 if counts.counts["violations"] else 0
