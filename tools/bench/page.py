"""The tables and docs/benchmarks.md: the summary (a row per question a
user asks, each naming its scenario by id), then a table per topic (each
naming its scenarios by id)."""

from __future__ import annotations

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple


class Row(NamedTuple):
  id: str      # the scenario's
  title: str
  unit: str
  values: Dict[str, float]  # {implementation: value}


def format_table(rows: List[Row]) -> str:
  """A table of `rows` with the columns that have values, and the ratios
  of each baseline to each of ours where a row has both."""
  names: List[str] = []
  for row in rows:
    names += [n for n in row.values if n not in names]
  ours = [n for n in names if n.startswith("hcb[")]
  theirs = [n for n in names if not n.startswith("hcb[")]
  pairs = [(t, o) for o in ours for t in theirs
           if any(t in row.values and o in row.values for row in rows)]
  header = ["scenario", "unit", *names, *[f"{t} / {o}" for t, o in pairs]]
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for _, title, unit, values in rows:
    cells = [title, unit]
    cells += [f"{values[n]:.3g}" if n in values else "" for n in names]
    cells += [f"{values[t] / values[o]:.2f}x" if t in values and o in values
              and values[o] > 0 else "" for t, o in pairs]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


# The summary, a row per question a user asks: (question, the id of the
# scenario that answers it, JAX's alternatives, of which the fastest in the
# row is shown, and a column that gives the scale, if any).
SUMMARY: List[Tuple[str, str, Tuple[str, ...], Optional[str]]] = [
    ("a tap in a jitted step (synchronous, the CPU default)",
     "step-tap-sync", ("debug.callback", "io_callback"), "no callback"),
    ("a tap in a jitted step (outfeed mode)", "step-tap",
     ("debug.callback", "io_callback"), "no callback"),
    ("a tap in a scan, per step (synchronous)", "scan-tap-sync",
     ("debug.callback", "io_callback"), None),
    ("a tap in a scan, per step (outfeed mode, until the taps ran)",
     "scan-tap-drained", ("debug.callback", "io_callback"), None),
    ("a tap in a scan dispatched while the step before it runs, per step "
     "(synchronous)", "scan-tap-sync-behind",
     ("debug.callback", "io_callback"), None),
    ("a call in a jitted step", "step-call",
     ("pure_callback", "io_callback"), "no callback"),
    ("a call in a scan, per step", "scan-call",
     ("pure_callback", "io_callback"), None),
    ("a large array to the host: a 256 MiB tap (outfeed mode)",
     "large-tap-256mib", ("io_callback",), "jit(x+1)"),
    ("a large array to the host without a copy: a 256 MiB tap "
     "(synchronous, copy=False)", "large-tap-256mib-sync-nocopy",
     ("io_callback",), "jit(x+1)"),
    ("a large array to the host and back: a 256 MiB call",
     "large-call-256mib", ("pure_callback", "io_callback"), "jit(x+1)"),
    ("a large array to the host and back without a copy: a 256 MiB call "
     "filling out= (synchronous, buffers=True)",
     "large-call-256mib-buffers-sync", ("buffer_callback",), "jit(x+1)"),
    ("each device's shard to the host: a 256 MiB tap sharded over 4 "
     "devices (partitioned=True)", "sharded-tap-256mib",
     ("debug.callback(partitioned)",), "hcb gathered"),
    ("the barrier, with nothing to wait for (1 device)",
     "barrier-idle-1-device-no-arrays-sync", ("effects_barrier",), None),
    ("a barrier after every ~1 ms step", "barrier-loop-native-sync",
     ("block_until_ready",), "no barrier"),
    ("a progress bar, per update (print_rate=1, synchronous)",
     "bar-update-sync", ("jax-tqdm",), None),
    ("a loop event of unmodified code (jax-tap's telemetry), per step, "
     "scalar select (synchronous)", "loop-event-sync", ("jaxtap",), None),
    ("a scan with a progress bar at the default rate (synchronous)",
     "bar-default-rate-sync", ("jax-tqdm",), "no bar"),
]


# Each hot row's floor (tools/bench/floors.py), the summary's last column:
# {hot row's scenario id: its floor's}. Each hot row is a tap whose host
# function runs, so its floor is the Python one: XLA's dispatch of a custom
# call, the GIL taken and one Python call, which no tap can avoid (the
# outfeed tap's call runs on a receiver thread, but once a step all the
# same). The dispatch floor, in the detail table, shows how much of that is
# XLA's.
FLOORS: Dict[str, str] = {
    "scan-tap-sync": "scan-floor-python",
    "scan-tap-drained": "scan-floor-python",
    "loop-event-sync": "scan-floor-python",
}


class Topic(NamedTuple):
  title: str
  ids: Tuple[str, ...]  # its scenarios, in their order in the table
  note: str             # what to know to read the table


def _ids(*parts: Iterable[str]) -> Tuple[str, ...]:
  return tuple(i for part in parts for i in part)


_LARGE = _ids(("tap-32mib",), *[
    [f"large-tap-{mib}mib", f"large-tap-{mib}mib-sync",
     f"large-tap-{mib}mib-sync-nocopy", f"large-call-{mib}mib",
     f"large-call-{mib}mib-nocopy"] for mib in (32, 256)],
    ("large-call-256mib-buffers-sync",),
    [f"size-sweep-{size}" for size in ("4b", "64kib", "1mib", "16mib",
                                       "1gib")])
_BARRIER = _ids(
    [f"barrier-loop-{t}-{mode}" for t in ("python", "native")
     for mode in ("sync", "outfeed")],
    [f"barrier-idle-{setup}-{arrays}-arrays-{mode}"
     for setup in ("1-device", "all-devices", "all-devices-after-pmap")
     for arrays in ("no", "1000", "many") for mode in ("sync", "outfeed")])

# The detail tables, the barrier's last; every scenario is in one.
TOPICS: List[Topic] = [
    Topic("Taps in a jitted step", ("step-tap", "step-tap-sync"),
          "A jitted step (a 16x16 matmul and a sum) with one tap of the "
          "sum, called 2000 times from a Python loop, until its taps ran; "
          "`no callback` is the same step without the tap."),
    Topic("Taps in a scan", ("scan-tap-ready", "scan-tap-drained",
                             "scan-tap-sync", "scan-floor-dispatch",
                             "scan-floor-python", "scan-tap-sync-behind",
                             "scan-tap-f32x1000"),
          "\"until ready\": until the scan's output is ready; \"until "
          "drained\": until every tap function ran. Every column's tap "
          "function is the same one, which does nothing (JAX's callbacks "
          "call it with the value, host_callback's with the value and the "
          "transforms). The floors are what no "
          "tap in a scan step can go below, measured in the same process: "
          "a custom call that does nothing (XLA's dispatch) and one that "
          "takes the GIL and calls a Python function that does nothing "
          "(the Python floor), each the µs it adds to a step of the bare "
          "scan (`bare scan`, its µs per step), the scans taking turns. "
          "A scan \"dispatched while the computation before it runs\" "
          "gets that computation's output as its input, so XLA runs it on "
          "one of its own threads, not the caller's, as in a loop that "
          "does not wait for each step."),
    Topic("Calls", ("step-call", "scan-call", "call-one", "call-32mib"), ""),
    Topic("A tap then a call in a jitted step",
          ("step-tap-then-call", "step-tap-then-call-sync"),
          "The step of \"Taps in a jitted step\" with neither, the tap "
          "alone, the call alone (x+1) and the tap then the call, taking "
          "turns, for host_callback on each transport and for "
          "`io_callback` (the tap) then `pure_callback` (the call); the "
          "last column (a ratio, not a time) is 1 where the pair costs "
          "what its parts do."),
    Topic("Large arrays", _LARGE,
          "`jit(x+1)` is one pass over the same array: the yardstick for a "
          "tap (one copy) and a call. The taps return one element of the "
          "array, not the array, so that XLA copies nothing for the "
          "output."),
    Topic("Sharded values", ("sharded-tap-256mib",),
          "A tap with `partitioned=True` (each device sends its own shard) "
          "beside the same tap gathered to one device (`hcb gathered`, the "
          "default) and `jax.debug.callback(partitioned=True)`; the taps "
          "return the first element of each row, so that nothing is "
          "gathered for the output."),
    Topic("Slow host functions", ("slow-consumer-returns",
                                  "slow-consumer-ready",
                                  "slow-consumer-drained",
                                  "slow-consumer-returns-sync"), ""),
    Topic("Watching loops", ("loop-event-sync", "lens-scan-64x64-sync",
                             "lens-scan-64x64-one-core-sync"),
          "`host_callback.loops.verbose` (jax-tap's interface) against "
          "jax-tap's own (no column where jax-tap was not installed): what "
          "each step's event adds to a trivial scan step (the scans with "
          "and without the lens taking turns), and a scan of a 64x64 "
          "matmul sampled every 100 steps beside the same scan without a "
          "lens, as it runs and with every thread of the process on one "
          "core: XLA splits the matmul between its pool's threads, and on "
          "a 2-core VM whose cores differ in speed how that split lands "
          "moves the scan's time, and the ratio, by more than 5% from one "
          "process to the next; on one core the ratio repeats."),
    Topic("Progress bars", ("bar-update-sync", "bar-update-drained",
                            "bar-default-rate-sync"),
          "`host_callback.tqdm.scan_tqdm` against jax-tqdm 0.4's (no "
          "column where jax-tqdm was not installed) and the same scan "
          "without a bar."),
    Topic("barrier_wait", _BARRIER,
          "An idle barrier (nothing pending) at several numbers of live "
          "arrays, beside `jax.effects_barrier()` (which waits for JAX's "
          "own effects only), and a training loop with a barrier every "
          "step against the same loop without it (ratio above 0.98: within "
          "2%) and with `block_until_ready` of each step's output instead, "
          "the least any wait for a step's tap costs; the three loops take "
          "turns every 20 steps, each round in the next order, so that the "
          "machine's drift reaches all of them. The barrier's figure is the "
          "median of its stretches, each other loop's that median times the "
          "median of its ratio to the barrier's loop in the same round, "
          "which the drift between rounds does not move (the ratio of the "
          "two medians moved by 0.05 from run to run on a 2-core VM). Why "
          "the outfeed rows stay above `block_until_ready`: see \"What the "
          "counters cost and cover\" in `docs/architecture.md`."),
]
BARRIER_IDS = frozenset(TOPICS[-1].ids)


def check_ids(known: Iterable[str]) -> None:
  """Raises ValueError unless every id SUMMARY and TOPICS name is `known`
  and every known scenario is in exactly one topic."""
  known = list(known)
  named = [i for topic in TOPICS for i in topic.ids]
  problems = [f"unknown scenario id {i!r} in SUMMARY" for _, i, _, _ in SUMMARY
              if i not in known]
  problems += [f"unknown scenario id {i!r} in TOPICS" for i in named
               if i not in known]
  problems += [f"unknown scenario id {i!r} in FLOORS"
               for pair in FLOORS.items() for i in pair if i not in known]
  problems += [f"scenario {i!r} is in {named.count(i)} topics, not one"
               for i in known if named.count(i) != 1]
  if problems:
    raise ValueError("; ".join(problems))


def _ratio(value: float) -> str:
  """A ratio to 2 significant figures or so: 230x, 18x, 8.1x, 0.31x."""
  if value >= 10:
    return f"{value:.0f}x"
  return f"{value:.1f}x" if value >= 1 else f"{value:.2f}x"


def _ours(values: Dict[str, float]) -> Optional[str]:
  """Our column: the native transport's, else the Python one's."""
  return next((n for n in ("hcb[native]", "hcb[python]") if n in values),
              None)


def _measured(by_id: Dict[str, Row], question: str, scenario: str,
              column: Optional[str] = None) -> Tuple[Row, str]:
  """`scenario`'s row and its `column` (by default, ours). Raises
  ValueError where the row or the column was not measured."""
  row = by_id.get(scenario)
  found = None if row is None else (
      _ours(row.values) if column is None
      else column if column in row.values else None)
  if row is None or found is None:
    raise ValueError(f"the summary's question {question!r} needs scenario "
                     f"{scenario!r}, which was not measured")
  return row, found


def _to_floor(by_id: Dict[str, Row], question: str, scenario: str,
              value: float) -> str:
  """The summary's floor cell of a hot row (FLOORS): `value` / its floor's,
  and the floor's; empty for other rows."""
  if scenario not in FLOORS:
    return ""
  floor, column = _measured(by_id, question, FLOORS[scenario], "floor")
  least = floor.values[column]
  return f"{_ratio(value / least)} (`{floor.id}`: {least:.3g} {floor.unit})"


def summary_table(rows: List[Row]) -> str:
  """The summary: a row per question of SUMMARY. Raises ValueError where
  a question's scenario or its floor (FLOORS) has no row (not measured)
  or no column of ours."""
  lines = ["| question | host_callback | best JAX alternative | "
           "alternative / host_callback | for scale | host_callback / its "
           "floor |",
           "|---|---|---|---|---|---|"]
  by_id = {row.id: row for row in reversed(rows)}  # a scenario's first row
  for question, scenario, alternatives, scale in SUMMARY:
    row, ours = _measured(by_id, question, scenario)
    unit, values = row.unit, row.values
    mine = f"{values[ours]:.3g} {unit}" + (
        "" if ours == "hcb[native]" else " (python transport)")
    present = [a for a in alternatives if a in values]
    best = min(present, key=values.__getitem__) if present else None
    theirs = (f"`{best}` {values[best]:.3g} {unit}" if best else
              f"none measured ({', '.join(alternatives)} not installed)")
    ratio = _ratio(values[best] / values[ours]) if best else ""
    scaled = (f"{scale}: {values[scale]:.3g} {unit}"
              if scale and scale in values else "")
    floor = _to_floor(by_id, question, scenario, values[ours])
    lines.append(f"| {question} | {mine} | {theirs} | {ratio} | {scaled} | "
                 f"{floor} |")
  return "\n".join(lines)


def page(rows: List[Row], machine_line: str) -> str:
  """docs/benchmarks.md: the summary, then the detail tables by topic."""
  parts = [
      "# Benchmarks\n\nGenerated from one run of `python -m tools.bench "
      f"--write docs` on {machine_line}. Rows run in the outfeed mode "
      "unless they say \"synchronous\" (the CPU default); times are "
      "medians. Ratios are the alternative's time / host_callback's: above "
      "1, host_callback is faster. The figures of a GPU (one H200) are in "
      "[GPU validation](gpu.md).\n\n## Summary\n\nOne row per question, "
      "host_callback on its native transport beside the fastest of JAX's "
      "own callbacks that does the same; the detail tables below have "
      "both transports and every alternative. The last column puts each "
      "tap in a scan step beside the least such a tap can cost, measured "
      "in the same run: the Python floor, a custom call that takes the "
      "GIL and calls a Python function that does nothing (\"Taps in a "
      "scan\").\n\n" + summary_table(rows)]
  for title, ids, note in TOPICS:
    chosen = [row for i in ids for row in rows if row.id == i]
    if chosen:
      parts.append(f"## {title}\n\n" + (note + "\n\n" if note else "")
                   + format_table(chosen))
  return "\n\n".join(parts) + "\n"
