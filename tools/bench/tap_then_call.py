"""A jitted step with a tap then a call (issue 61): does the pair cost
more than its parts? The step of `measure.step_run` from a Python loop
with neither, the tap alone, the call alone and both, taking turns
(`measure.in_turns`), for host_callback on each transport and for
`jax.experimental.io_callback` (the tap) then `jax.pure_callback` (the
call); each row's last column is `tap then call / (tap only + call only -
no callback)`: 1 where the pair costs what its parts do."""

from __future__ import annotations

from typing import Callable, Dict, Sequence

from . import ways
from .measure import Values, in_mode, in_turns, step_run, with_transport

RATIO = "tap then call / (tap + call - no callback)"
PEERS = "io_callback then pure_callback"


def _plus_one(a):
  return a + 1


def _row(tap: Callable, call: Callable, turns: int) -> Values:
  """µs per call of the step with each of neither, `tap`, `call` and
  `call(tap(x))`, in turns; and the ratio."""
  times = in_turns({"no callback": step_run(lambda x: x),
                    "tap only": step_run(tap),
                    "call only": step_run(call),
                    "tap then call": step_run(lambda x: call(tap(x)))},
                   turns)
  values = {name: 1e6 * seconds for name, seconds in times.items()}
  parts = values["tap only"] + values["call only"] - values["no callback"]
  if parts > 0:
    values[RATIO] = values["tap then call"] / parts
  return values


def measure(repeat: int, synchronous: bool
            ) -> Callable[[Sequence[str]], Dict[str, Values]]:
  """`measure(transports)`: {implementation: values}, in the synchronous
  mode or the outfeed one; 3 * `repeat` turns."""
  turns = 3 * repeat

  def hcb_row() -> Values:
    return _row(ways.tap_hcb(ways.noop), ways.call_hcb(_plus_one), turns)

  def peers_row() -> Values:
    return _row(ways.tap_io(ways.noop), ways.call_pure(_plus_one), turns)

  def by_implementation(transports: Sequence[str]) -> Dict[str, Values]:
    rows = {f"hcb[{t}]": with_transport(t, in_mode(synchronous, hcb_row))
            for t in transports}
    rows[PEERS] = in_mode(synchronous, peers_row)()
    return rows
  return by_implementation
