"""The barrier's scenarios: an idle `barrier_wait` at several numbers of
live arrays, devices and both modes, beside `jax.effects_barrier()`, and a
training loop with a barrier every step.

They run first, in a fresh process, the training loop (one device) before
the idle rows: which device queues are open (one device, then four) and
whether a computation of ours over several devices ran change what a
barrier does. `loop_times` also serves `tools.gpu.timings`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

import host_callback as hcb

from .measure import Values
from .scenarios import Scenario

TRANSPORTS = ("python", "native")
# The loops of the training-loop rows take turns after this many steps.
_TURN = 20


def _noop(*args, **kwargs) -> None:
  return None


def _per_call(wait: Callable[[], None], count: int) -> float:
  """Microseconds per call of `wait`, after one call."""
  wait()
  start = time.perf_counter()
  for _ in range(count):
    wait()
  return 1e6 * (time.perf_counter() - start) / count


def _tap_on(devices: List[jax.Device]) -> None:
  """One single-device tap on each device (opens its queues)."""
  tap = jax.jit(lambda x: hcb.id_tap(_noop, x))
  for device in devices:
    tap(jax.device_put(jnp.float32(0), device))
  hcb.barrier_wait()


def _tap_in_pmap(devices: List[jax.Device]) -> None:
  jax.pmap(lambda x: hcb.id_tap(_noop, x), devices=devices)(
      jnp.arange(float(len(devices))))
  hcb.barrier_wait()


def _in_mode(transport: str, synchronous: bool, measure: Callable[[], Any]
             ) -> Any:
  jax.config.update("jax_host_callback_transport", transport)
  jax.config.update("jax_host_callback_outfeed", not synchronous)
  try:
    return measure()
  finally:
    jax.config.update("jax_host_callback_transport", "auto")
    jax.config.update("jax_host_callback_outfeed", True)


def _idle(setup: Callable[[List[jax.Device]], None],
          devices: List[jax.Device], arrays: int, count: int,
          synchronous: bool) -> Callable[[Sequence[str]], Values]:
  """µs per idle `barrier_wait` on each transport after `setup(devices)`,
  with `arrays` live arrays, and per `jax.effects_barrier()`."""
  def measure(transports: Sequence[str]) -> Values:
    held = [jnp.full((2,), i, jnp.float32) for i in range(arrays)]
    jax.block_until_ready(held)
    values = {}
    for t in transports:
      _in_mode(t, synchronous, lambda: setup(devices))
      values[f"hcb[{t}]"] = _in_mode(
          t, synchronous, lambda: _per_call(hcb.barrier_wait, count))
    values["effects_barrier"] = _per_call(jax.effects_barrier, count)
    del held
    return values
  return measure


def _idle_scenarios(array_counts: Tuple[int, ...], count: int
                    ) -> List[Scenario]:
  """One device, then every device with single-device taps, then every
  device after a tap in a pmap; at each number of live arrays (the last:
  "many") and in both modes."""
  devices = jax.devices()
  setups = [("1-device", "1 device", devices[:1], _tap_on),
            ("all-devices", f"{len(devices)} devices", devices, _tap_on),
            ("all-devices-after-pmap", f"{len(devices)} devices after a pmap",
             devices, _tap_in_pmap)]
  names = ("no", "1000", "many")
  scenarios = []
  for setup_id, label, setup_devices, setup in setups:
    for name, arrays in zip(names, array_counts):
      for synchronous in (True, False):
        mode = "synchronous" if synchronous else "outfeed"
        scenarios.append(Scenario(
            f"barrier-idle-{setup_id}-{name}-arrays-"
            f"{'sync' if synchronous else 'outfeed'}",
            f"idle barrier_wait, {label}, {arrays} live arrays ({mode}; "
            "jax: effects_barrier)", "µs",
            _idle(setup, setup_devices, arrays, count, synchronous)))
  return scenarios


def _training_step() -> Tuple[Callable, jax.Array]:
  """A jitted step of about 1 ms on a 2-core CPU, with one tap."""
  weights = jnp.full((256, 256), 1e-3, jnp.float32)

  @jax.jit
  def step(x):
    for _ in range(4):
      x = jnp.tanh(x @ weights)
    return hcb.id_tap(_noop, jnp.sum(x)), x
  return step, jnp.ones((256, 256), jnp.float32)


def loop_times(x: jax.Array, steps: int, repeat: int,
               loops: Dict[str, Tuple[Callable, Callable[[jax.Array], None]]],
               reference: Optional[str] = None) -> Dict[str, float]:
  """Median ms per step of each loop `name`: calls of `step` (which returns
  (loss, x)), with `wait(output)` after each one, for `loops[name] =
  (step, wait)`: `steps` calls (rounded up to whole stretches) in
  stretches of `_TURN` that start from `x` and end waiting for their last
  step and its taps. The loops take turns every stretch, each round in the
  next order (the first of a round is not always the same), so that the
  machine's drift (large on a small VM) reaches all of them alike; the
  median is over the stretches. With a `reference` loop, each other
  loop's figure is the reference's median times the median of its ratio
  to the reference within a round, which the drift between rounds does
  not move."""
  names = list(loops)
  times: Dict[str, List[float]] = {name: [] for name in names}
  turn = min(_TURN, steps)
  for _ in range(repeat):
    for _ in range(-(-steps // turn)):
      for name in names:
        step, wait = loops[name]
        start = time.perf_counter()
        y = x
        for _ in range(turn):
          _, y = step(y)
          wait(y)
        jax.block_until_ready(y)
        hcb.barrier_wait()
        times[name].append(1e3 * (time.perf_counter() - start) / turn)
      names = names[1:] + names[:1]
  medians = {name: upper_median(t) for name, t in times.items()}
  if reference is None:
    return medians
  return {name: medians[reference] * upper_median(
              [a / b for a, b in zip(t, times[reference])])
          for name, t in times.items()}


def upper_median(values: Sequence[float]) -> float:
  """The middle value of `values`, the upper one of an even count."""
  return sorted(values)[len(values) // 2]


def _training_loop(transport: str, synchronous: bool, steps: int,
                   arrays: int, repeat: int
                   ) -> Callable[[Sequence[str]], Values]:
  """ms per step of a loop of a 1 ms step with a tap, with a barrier_wait
  every step, against the same loop without it and with
  `block_until_ready` of the step's output instead (which any wait for the
  step's tap costs at least: no step overlaps the next one's dispatch);
  `arrays` live arrays. Not measured ({}) where `transport` is not
  available."""
  def measure(transports: Sequence[str]) -> Values:
    if transport not in transports:
      return {}
    held = [jnp.full((2,), i, jnp.float32) for i in range(arrays)]
    step, x = _training_step()
    waits = {f"hcb[{transport}]": lambda y: hcb.barrier_wait(),
             "no barrier": _noop, "block_until_ready": jax.block_until_ready}

    def loops(steps: int, repeat: int) -> Dict[str, float]:
      return _in_mode(transport, synchronous, lambda: loop_times(
          x, steps, repeat,
          {name: (step, wait) for name, wait in waits.items()},
          reference=f"hcb[{transport}]"))
    loops(steps=20, repeat=1)  # compile and warm up
    values = loops(steps, repeat)
    del held
    return values
  return measure


def scenarios(scale: int, repeat: int) -> List[Scenario]:
  """The barrier's scenarios, in the order they run: the training loop
  first (it taps on one device, as most training loops do), then the idle
  barrier; sizes divided by `scale`."""
  steps, arrays = 1000 // scale, 10_000
  loops = [Scenario(
      f"barrier-loop-{t}-{'sync' if synchronous else 'outfeed'}",
      f"{steps}-step loop of a ~1 ms jitted step with a tap, barrier_wait "
      f"every step, {arrays} live arrays ({t}, "
      f"{'synchronous' if synchronous else 'outfeed'})", "ms",
      _training_loop(t, synchronous, steps, arrays, repeat))
           for t in TRANSPORTS for synchronous in (True, False)]
  return loops + _idle_scenarios((0, 1000, 100_000 // scale), 2000 // scale)
