"""The barrier rows of `tools.bench`: an idle `barrier_wait` at several
numbers of live arrays, devices and both modes, beside
`jax.effects_barrier()`, and a training loop with a barrier every step.

They run first, in a fresh process, the training loop (one device) before
the idle rows: which device queues are open (one device, then four) and
whether a computation of ours over several devices ran change what a
barrier does.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp

import host_callback as hcb

Row = Tuple[str, str, Dict[str, float]]
# The loops of the training-loop rows take turns after this many steps.
_TURN = 100


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


def _in_mode(transport: str, synchronous: bool, measure: Callable[[], float]
             ) -> float:
  jax.config.update("jax_host_callback_transport", transport)
  jax.config.update("jax_host_callback_outfeed", not synchronous)
  try:
    return measure()
  finally:
    jax.config.update("jax_host_callback_transport", "auto")
    jax.config.update("jax_host_callback_outfeed", True)


def idle_rows(transports: List[str], array_counts: Tuple[int, ...],
              count: int, wanted: Callable[[str], bool]) -> List[Row]:
  """Idle barrier rows: one device, then every device with single-device
  taps, then every device after a tap in a pmap; at each number of live
  arrays and in both modes."""
  devices = jax.devices()
  setups = [("1 device", devices[:1], _tap_on),
            (f"{len(devices)} devices", devices, _tap_on),
            (f"{len(devices)} devices after a pmap", devices, _tap_in_pmap)]
  rows: List[Row] = []
  for label, setup_devices, setup in setups:
    for arrays in array_counts:
      held = [jnp.full((2,), i, jnp.float32) for i in range(arrays)]
      jax.block_until_ready(held)
      for synchronous in (True, False):
        mode = "synchronous" if synchronous else "outfeed"
        scenario = (f"idle barrier_wait, {label}, {arrays} live arrays "
                    f"({mode}; jax: effects_barrier)")
        if not wanted(scenario):
          continue
        values = {}
        for t in transports:
          _in_mode(t, synchronous, lambda: setup(setup_devices))
          values[f"hcb[{t}]"] = _in_mode(
              t, synchronous, lambda: _per_call(hcb.barrier_wait, count))
        values["effects_barrier"] = _per_call(jax.effects_barrier, count)
        rows.append((scenario, "µs", values))
      del held
  return rows


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
               loops: Dict[str, Tuple[Callable, Callable[[jax.Array], None]]]
               ) -> Dict[str, float]:
  """Median ms per step of each loop `name`: calls of `step` (which returns
  (loss, x)), with `wait(output)` after each one, for `loops[name] =
  (step, wait)`: `steps` calls (rounded up to whole stretches) in
  stretches of `_TURN` that start from `x` and end waiting for their last
  step and its taps. The loops take turns every stretch, so that the
  machine's drift (large on a small VM) reaches all of them alike; the
  median is over the stretches."""
  times: Dict[str, List[float]] = {name: [] for name in loops}
  turn = min(_TURN, steps)
  for _ in range(repeat):
    for _ in range(-(-steps // turn)):
      for name, (step, wait) in loops.items():
        start = time.perf_counter()
        y = x
        for _ in range(turn):
          _, y = step(y)
          wait(y)
        jax.block_until_ready(y)
        hcb.barrier_wait()
        times[name].append(1e3 * (time.perf_counter() - start) / turn)
  return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def training_loop_rows(transports: List[str], steps: int, arrays: int,
                       repeat: int, wanted: Callable[[str], bool]) -> List[Row]:
  """ms per step of a loop of a 1 ms step with a tap, with a barrier_wait
  every step, against the same loop without it and with
  `block_until_ready` of the step's output instead (which any wait for the
  step's tap costs at least: no step overlaps the next one's dispatch);
  `arrays` live arrays."""
  rows: List[Row] = []
  held = [jnp.full((2,), i, jnp.float32) for i in range(arrays)]
  step, x = _training_step()
  for t in transports:
    for synchronous in (True, False):
      mode = "synchronous" if synchronous else "outfeed"
      scenario = (f"{steps}-step loop of a ~1 ms jitted step with a tap, "
                  f"barrier_wait every step, {arrays} live arrays ({t}, "
                  f"{mode})")
      if not wanted(scenario):
        continue
      waits = {f"hcb[{t}]": lambda y: hcb.barrier_wait(), "no barrier": _noop,
               "block_until_ready": jax.block_until_ready}
      def loops(steps: int, repeat: int) -> Dict[str, float]:
        return _in_mode(t, synchronous, lambda: loop_times(
            x, steps, repeat,
            {name: (step, wait) for name, wait in waits.items()}))
      loops(steps=20, repeat=1)  # compile and warm up
      rows.append((scenario, "ms", loops(steps, repeat)))
  del held
  return rows
