"""The scenarios: each has a stable id (what `--only`, the page's summary
and its topics name), a title (the table's "scenario" cell, whose sizes
shrink with `--quick`), a unit, and how to measure it: on each available
transport, beside JAX's own callbacks."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from . import floors, machine, tap_then_call, ways
from .measure import (Measure, Values, behind_a_running_computation, compare,
                      compare_in_turns, lens_scan_run, one_shot_time,
                      over_bare_scan, per_event,
                      per_update, bar_scan_time, scan_times,
                      slow_consumer_times, step_time)


@dataclasses.dataclass(frozen=True)
class Scenario:
  """One row of the tables: `measure(transports)` gives its values, or {}
  where it cannot run here (then it has no row)."""
  id: str
  title: str
  unit: str
  measure: Measure

  def rows(self, transports: Sequence[str]) -> List[Tuple[str, Values]]:
    """(title, values) of its rows: one, or none if not measured."""
    values = self.measure(transports)
    return [(self.title, values)] if values else []


@dataclasses.dataclass(frozen=True)
class SplitScenario:
  """A scenario measured once for several rows: `measure_each` gives
  {label: values}, a row per label, titled "title: label"."""
  id: str
  title: str
  unit: str
  measure_each: Callable[[Sequence[str]], Dict[str, Values]]

  def rows(self, transports: Sequence[str]) -> List[Tuple[str, Values]]:
    return [(f"{self.title}: {label}", values)
            for label, values in self.measure_each(transports).items()]


def _sync(title: str, synchronous: bool) -> str:
  return f"{title} (synchronous)" if synchronous else title


def _step(repeat: int) -> List[Scenario]:
  """A jitted step with one tap or call, from a Python loop (the same
  sizes in --quick)."""
  tap = lambda make: 1e6 * step_time(make(ways.noop), repeat)  # noqa: E731
  scenarios = [
      Scenario(f"step-tap{'-sync' * sync}", _sync(
          "jitted step with one tap, per call from a Python loop", sync),
               "µs", compare(tap, {**ways.NOTHING, **ways.TAPPERS},
                             ways.tap_hcb, synchronous=sync))
      for sync in (False, True)]
  scenarios.append(Scenario(
      "step-call", "jitted step with one call x+1, per call from a Python "
      "loop", "µs", compare(
          lambda make: 1e6 * step_time(make(lambda a: a + 1), repeat),
          {**ways.NOTHING, **ways.CALLERS}, ways.call_hcb)))
  return scenarios


AnyScenario = Union[Scenario, SplitScenario]


def _tap_then_call(repeat: int) -> List[AnyScenario]:
  """A jitted step with a tap then a call, beside the step with either
  alone and with neither (`tap_then_call.measure`)."""
  return [SplitScenario(
      f"step-tap-then-call{'-sync' * sync}", _sync(
          "jitted step with a tap then a call x+1, per call from a Python "
          "loop", sync), "µs",
      tap_then_call.measure(repeat, synchronous=sync))
          for sync in (False, True)]


def _scan(scale: int, repeat: int) -> List[Scenario]:
  """Taps in long scans."""
  steps = 100_000 // scale
  times = lambda make, x, n: scan_times(  # noqa: E731
      make(ways.noop), n, x, repeat)
  scenarios = [
      Scenario(f"scan-tap-{label}", f"tap f32 scalar, per step of a "
               f"{steps}-step scan (until {label})", "µs", compare(
                   lambda make, i=index: 1e6 * times(
                       make, jnp.float32(0), steps)[i],
                   ways.TAPPERS, ways.tap_hcb))
      for index, label in ((0, "ready"), (1, "drained"))]
  scenarios.append(Scenario(
      "scan-tap-sync", f"tap f32 scalar, per step of a {steps}-step scan "
      "(synchronous)", "µs", compare(
          lambda make: 1e6 * times(make, jnp.float32(0), steps)[0],
          ways.TAPPERS,
          ways.tap_hcb, synchronous=True)))
  scenarios += _floors(steps, repeat)
  scenarios.append(Scenario(
      "scan-tap-sync-behind", f"tap f32 scalar, per step of a {steps}-step "
      "scan dispatched while the computation before it runs, over the bare "
      "scan (synchronous)", "µs", compare(
          lambda make: behind_a_running_computation(
              make(ways.noop), steps, repeat),
          ways.TAPPERS, ways.tap_hcb, synchronous=True)))
  steps = 10_000 // scale
  scenarios.append(Scenario(
      "scan-tap-f32x1000", f"tap f32[1000], per step of a {steps}-step scan "
      "(until drained)", "µs", compare(
          lambda make: 1e6 * times(make, jnp.zeros(1000), steps)[1],
          ways.TAPPERS, ways.tap_hcb)))
  return scenarios


def _floors(steps: int, repeat: int) -> List[Scenario]:
  """The floors of a tap in a scan step (`floors.py`), over the bare scan,
  in turns with it (4 x `repeat` each), both on the first CPU device
  whatever the default backend (the floors' targets are XLA CPU's); no row
  where the native module is not built."""
  def measure(kind: str) -> Measure:
    def values(transports: Sequence[str]) -> Values:
      del transports  # no host_callback in them
      op = floors.step_op(kind)
      if op is None:
        return {}
      with jax.default_device(jax.devices("cpu")[0]):
        return over_bare_scan({"floor": op}, steps, 4 * repeat)
    return values
  return [Scenario(f"scan-floor-{kind}", f"floor: {what}, per step of a "
                   f"{steps}-step scan, over the bare scan", "µs",
                   measure(kind))
          for kind, what in (
              ("dispatch", "an FFI custom call that does nothing"),
              ("python", "an FFI custom call that takes the GIL and calls "
               "a Python function that does nothing"))]


def _one_shot(op_of: Callable[[Callable], Callable], shape: Tuple[int, ...],
              repeat: int, sharding=None) -> Callable[[Callable], float]:
  """ms for a jitted `op_of(make)` on a zero array of `shape`, allocated
  for the measurement only (and sharded by `sharding()`, if given)."""
  def ours(make: Callable) -> float:
    array = jnp.zeros(shape, jnp.float32)
    if sharding is not None:
      array = jax.device_put(array, sharding())
    return 1e3 * one_shot_time(op_of(make), array, repeat)
  return ours


def _large(repeat: int) -> List[Scenario]:
  """Large arrays: taps, calls, sizes, shards (the same sizes in
  --quick)."""
  tap = lambda make: make(ways.noop)  # noqa: E731
  identity = lambda make: make(lambda a: a)  # noqa: E731
  scenarios = [Scenario(
      "tap-32mib", "tap of 32 MiB f32[8,1024,1024] (until drained)", "ms",
      compare(_one_shot(tap, (8, 1024, 1024), repeat), ways.TAPPERS,
              ways.tap_hcb))]
  for mib in (32, 256):
    shape = (mib // 4, 1024, 1024)
    what = f"{mib} MiB f32[{mib // 4},1024,1024]"
    for suffix, sync, copy, title in (
        ("", False, True, ""), ("-sync", True, True, " (synchronous)"),
        ("-sync-nocopy", True, False, " (synchronous, copy=False)")):
      scenarios.append(Scenario(
          f"large-tap-{mib}mib{suffix}",
          f"large tap of {what}, until the host function ran{title}", "ms",
          compare(_one_shot(tap, shape, repeat),
                  {**ways.YARDSTICK,
                   "io_callback": lambda f: ways.first(ways.tap_io(f))},
                  lambda f, copy=copy: ways.first(ways.tap_hcb(f, copy)),
                  synchronous=sync)))
    for suffix, copy, title in (("", True, ""),
                                ("-nocopy", False, ", copy=False")):
      scenarios.append(Scenario(
          f"large-call-{mib}mib{suffix}",
          f"large call round trip of {what}, identity{title}", "ms",
          compare(_one_shot(identity, shape, repeat),
                  {**ways.YARDSTICK, **ways.CALLERS},
                  lambda f, copy=copy: ways.call_hcb(f, copy))))
  scenarios.append(Scenario(
      "large-call-256mib-buffers-sync", "large call round trip of 256 MiB "
      "f32[64,1024,1024], identity, buffers=True filling out= "
      "(synchronous)", "ms", compare(
          _one_shot(lambda make: make(ways.copy_into), (64, 1024, 1024),
                    repeat),
          {**ways.YARDSTICK,
           "hcb call": lambda f: ways.call_hcb(lambda a: a),
           **ways.buffer_callbacks()}, ways.call_hcb_filling,
          synchronous=True)))
  for size, label in ((1, "4 B"), (1 << 14, "64 KiB"), (1 << 18, "1 MiB"),
                      (1 << 22, "16 MiB"), (1 << 28, "1 GiB")):
    scenarios.append(Scenario(
        f"size-sweep-{label.replace(' ', '').lower()}",
        f"size sweep: tap of {label} f32[{size}] (until drained)", "ms",
        compare(_one_shot(tap, (size,), repeat), {},
                lambda f: ways.first(ways.tap_hcb(f)))))
  rows = lambda: NamedSharding(  # noqa: E731
      jax.make_mesh((4,), ("rows",)), P("rows"))
  scenarios.append(Scenario(
      "sharded-tap-256mib", "sharded tap of 256 MiB f32[64,1024,1024] over "
      "4 devices by rows, partitioned, until the host functions ran", "ms",
      compare(_one_shot(tap, (64, 1024, 1024), repeat, rows),
              {"hcb gathered": lambda f: ways.first_of_rows(ways.tap_hcb(f)),
               "debug.callback(partitioned)": lambda f: ways.first_of_rows(
                   ways.tap_debug_partitioned(f))},
              lambda f: ways.first_of_rows(ways.tap_hcb_partitioned(f)))))
  return scenarios


def _slow_consumer(scale: int, repeat: int) -> List[Scenario]:
  """Taps whose host function takes 1 ms."""
  taps = 1000 // scale
  times = lambda make: slow_consumer_times(  # noqa: E731
      make(ways.sleep_1ms), taps, repeat)
  labels = (("returns", "jitted call returns"), ("ready", "result ready"),
            ("drained", "consumers drained"))
  scenarios = [
      Scenario(f"slow-consumer-{name}",
               f"{taps} taps with a 1 ms consumer: {label}", "ms", compare(
                   lambda make, i=index: 1e3 * times(make)[i], ways.TAPPERS,
                   ways.tap_hcb))
      for index, (name, label) in enumerate(labels)]
  scenarios.append(Scenario(
      "slow-consumer-returns-sync", f"{taps} taps with a 1 ms consumer: "
      "jitted call returns (synchronous)", "ms", compare(
          lambda make: 1e3 * times(make)[0], ways.TAPPERS, ways.tap_hcb,
          synchronous=True)))
  return scenarios


def _calls(scale: int, repeat: int) -> List[Scenario]:
  """Calls in a scan, alone, and of 32 MiB."""
  steps = 10_000 // scale
  plus_one = lambda make: make(lambda a: a + 1)  # noqa: E731
  return [
      Scenario("scan-call", f"call x+1, per step of a {steps}-step scan",
               "µs", compare(lambda make: 1e6 * scan_times(
                   plus_one(make), steps, jnp.float32(0), repeat)[1],
                             ways.CALLERS, ways.call_hcb)),
      Scenario("call-one", "call x+1, one jitted call", "µs", compare(
          lambda make: 1e6 * one_shot_time(plus_one(make), jnp.float32(0),
                                           repeat),
          ways.CALLERS, ways.call_hcb)),
      Scenario("call-32mib", "call round trip of 32 MiB f32[8,1024,1024] "
               "(x+1)", "ms", compare(_one_shot(plus_one, (8, 1024, 1024),
                                                repeat),
                                      ways.CALLERS, ways.call_hcb))]


def _bars(scale: int, repeat: int) -> List[Scenario]:
  """Progress bars beside jax-tqdm's."""
  steps = 20_000 // scale
  scenarios = [
      Scenario(f"bar-update{'-sync' if sync else '-drained'}",
               f"progress bar update, per step of a {steps}-step scan of a "
               f"16x16 matmul, print_rate=1 ({label})", "µs", compare(
                   lambda make: per_update(make, steps, repeat),
                   ways.progress_baselines() if sync else {}, ways.hcb_bar,
                   synchronous=sync))
      for sync, label in ((True, "synchronous"), (False, "until drained"))]
  scenarios.append(Scenario(
      "bar-default-rate-sync", f"{steps}-step scan of a 16x16 matmul with a "
      "progress bar at the default rate (synchronous)", "ms", compare(
          lambda make: 1e3 * bar_scan_time(make, steps, None, repeat),
          {"no bar": ways.no_bar, **ways.progress_baselines()},
          ways.hcb_bar, synchronous=True)))
  return scenarios


def _loops(scale: int, repeat: int) -> List[Scenario]:
  """Watching loops (host_callback.loops) beside jax-tap's."""
  steps = 20_000 // scale
  scenarios = [Scenario(
      "loop-event-sync", f"loop event with a scalar select, per step of a "
      f"{steps}-step scan (synchronous)", "µs", compare(
          lambda make: per_event(make, steps, repeat), ways.lens_baselines(),
          ways.hcb_lens, synchronous=True))]
  # Short scans, many turns: a 5% difference is below the drift of one
  # long run here. Also on one core, where that can be done (Linux): see
  # `machine.on_one_core`.
  steps = 2000 // scale
  for suffix, where, confined in (
      ("", "", contextlib.nullcontext),
      ("-one-core", ", on one core", machine.on_one_core)):
    measure: Measure = compare_in_turns(
        lambda make: lens_scan_run(make, steps, 100, 64),
        {"no lens": ways.no_lens, **ways.lens_baselines()}, ways.hcb_lens,
        turns=100 * repeat, synchronous=True, confined=confined)
    if suffix and not machine.can_confine():
      measure = lambda transports: {}  # noqa: E731  (no row)
    scenarios.append(Scenario(
        f"lens-scan-64x64{suffix}-sync", f"{steps}-step scan of a 64x64 "
        f"matmul watched with sample_every=100, scalar select (synchronous"
        f"{where}, in turns with the scan without a lens)", "ms", measure))
  return scenarios


def scenarios(scale: int, repeat: int) -> List[AnyScenario]:
  """Every scenario but the barrier's (`barrier_scenarios.scenarios`), in
  the order they run: sizes divided by `scale`, medians of `repeat` runs."""
  chosen: List[AnyScenario] = []
  for part in (_step(repeat), _tap_then_call(repeat), _scan(scale, repeat),
               _large(repeat), _slow_consumer(scale, repeat),
               _calls(scale, repeat), _bars(scale, repeat),
               _loops(scale, repeat)):
    chosen += part
  return chosen
