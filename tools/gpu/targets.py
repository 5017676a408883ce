"""The GPU speed targets of the native transport (docs/gpu.md), judged from
what `tools.gpu.check` measured: its timing rows (tools/gpu/timings.py),
`tools.bench`'s GPU rows (a markdown table) and the hardware programs'
lines (tools/gpu/hardware). Each target is a check, PASS or FAIL, whose detail
gives the figures; a target whose figures are missing fails, saying which.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Check = Tuple[str, bool, str]  # as tools/gpu/check.py's
Row = Tuple[str, float, str]   # as tools/gpu/timings.py's
NATIVE = "hcb[native]"


def bench_table(text: str) -> Dict[str, Dict[str, float]]:
  """`tools.bench`'s markdown table: scenario -> {column: value}, for the
  cells that hold a number (ratio columns end in "x" and are left out)."""
  table: Dict[str, Dict[str, float]] = {}
  header: List[str] = []
  for line in text.splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if not line.startswith("|") or set(cells[0]) <= set("-"):
      continue
    if cells[0] == "scenario":
      header = cells
      continue
    values = {}
    for name, cell in zip(header[2:], cells[2:]):
      try:
        values[name] = float(cell)
      except ValueError:
        pass
    table[cells[0]] = values
  return table


def _find(table: Dict[str, Dict[str, float]], pattern: str
          ) -> Dict[str, float]:
  """The first row whose scenario matches `pattern`; {} if none."""
  return next((values for scenario, values in table.items()
               if re.fullmatch(pattern, scenario)), {})


def _timing(rows: Sequence[Row], pattern: str) -> Optional[float]:
  return next((value for name, value, _ in rows
               if re.fullmatch(pattern, name)), None)


def pinned_copy_ms(hardware: Sequence[str]) -> Optional[float]:
  """One 256 MiB pinned device-to-host copy (tap_limit.cu's line)."""
  for line in hardware:
    found = re.search(r"256 MiB D2H pinned: ([0-9.]+) ms", line)
    if found:
      return float(found.group(1))
  return None


def _judge(name: str, figures: Sequence[Optional[float]],
           verdict: Callable[..., Tuple[bool, str]]) -> Check:
  if any(figure is None for figure in figures):
    return name, False, "not measured"
  ok, detail = verdict(*figures)
  return name, ok, detail


def _floors(rows: Sequence[Row], scan_plain: float) -> str:
  """The floors of a tap in a scan step over the no-tap step (`scan_plain`
  µs), measured where the timing rows have them: "; floors: XLA's +a,
  Python's +b"."""
  figures = [(who, _timing(rows, rf"\+ {what} every step \(the floor\)"))
             for who, what in (
                 ("XLA's", "a custom call that does nothing"),
                 ("Python's", "a custom call that calls a Python function "
                              "that does nothing"))]
  shown = [f"{who} +{value - scan_plain:.1f}" for who, value in figures
           if value is not None]
  return f"; floors: {', '.join(shown)}" if shown else ""


def target_checks(rows: Sequence[Row], bench: str,
                  hardware: Sequence[str]) -> List[Check]:
  """One check per speed target of docs/gpu.md (the soak is a check of its
  own in tools/gpu/check.py)."""
  table = bench_table(bench)
  copy_ms = pinned_copy_ms(hardware)
  step = _find(table, r"jitted step with one tap, per call from a Python "
                      r"loop")
  calls = _find(table, r"call x\+1, per step of a \d+-step scan")
  big_tap = _find(table, r"large tap of 256 MiB \S+, until the host "
                         r"function ran")
  big_call = _find(table, r"large call round trip of 256 MiB \S+, "
                          r"identity")
  scan_plain = _timing(rows, r"scan step, no tap")
  return [
      _judge("target: tap per scan step <= 4 µs over the step",
             [_timing(rows, r"\+ id_tap every step \(native\)"),
              scan_plain],
             lambda tap, plain: (tap - plain <= 4,
                                 f"+{tap - plain:.1f} µs ({tap:.1f} against "
                                 f"{plain:.1f}){_floors(rows, plain)}")),
      _judge("target: jitted step with one tap <= 1.3x the step",
             [step.get(NATIVE), step.get("no callback")],
             lambda tap, plain: (tap / plain <= 1.3,
                                 f"{tap / plain:.2f}x ({tap:.0f} against "
                                 f"{plain:.0f} µs)")),
      _judge("target: call in a scan >= 5x cheaper than pure_callback",
             [calls.get(NATIVE), calls.get("pure_callback")],
             lambda ours, theirs: (theirs / ours >= 5,
                                   f"{theirs / ours:.2f}x ({ours:.1f} "
                                   f"against {theirs:.1f} µs)")),
      _judge("target: 256 MiB tap <= 2x one pinned copy",
             [big_tap.get(NATIVE), copy_ms],
             lambda ours, copy: (ours / copy <= 2,
                                 f"{ours / copy:.2f}x ({ours:.2f} against "
                                 f"{copy:.2f} ms)")),
      _judge("target: 256 MiB call round trip <= 4x one pinned copy",
             [big_call.get(NATIVE), copy_ms],
             lambda ours, copy: (ours / copy <= 4,
                                 f"{ours / copy:.1f}x ({ours:.1f} against "
                                 f"{copy:.2f} ms)")),
      _judge("target: 256 MiB buffers=True round trip <= 2x one "
             "device-to-device copy",
             [_timing(rows, r"256 MiB identity round trip: call "
                            r"buffers=True .*"),
              _timing(rows, r"256 MiB identity round trip: one "
                            r"device-to-device copy .*")],
             lambda ours, copy: (ours / copy <= 2,
                                 f"{ours / copy:.2f}x ({ours:.2f} against "
                                 f"{copy:.2f} ms)")),
      _judge("target: ~1 ms step with a tap and barrier_wait() <= 1.1x "
             "waiting with block_until_ready",
             [_timing(rows, r".*: tap \+ barrier_wait\(\) every step "
                            r"\(native\)"),
              _timing(rows, r".*: no tap, block_until_ready every step")],
             lambda ours, plain: (ours / plain <= 1.1,
                                  f"{ours / plain:.2f}x ({ours:.3f} against "
                                  f"{plain:.3f} ms)")),
  ]
