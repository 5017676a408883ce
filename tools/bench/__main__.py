"""`python -m tools.bench`: see the package's docstring."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional, Sequence

# Four CPU devices, for the barrier rows; every other row uses device 0.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402  (after XLA_FLAGS)

from host_callback.host import transport_policy  # noqa: E402
from tools import bench  # noqa: E402
from tools.bench import (barrier_scenarios, machine, page,  # noqa: E402
                         scenarios)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m tools.bench",
                                   description=bench.__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="10x smaller sizes, for a smoke test")
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--only", default="", metavar="REGEX",
                      help="run only the scenarios whose id or title matches")
  parser.add_argument("--write", metavar="DOCS_DIR",
                      help="also write DOCS_DIR/benchmarks.md (not with "
                           "--only: the page needs every scenario)")
  parser.add_argument("--list", action="store_true",
                      help="print each scenario's id and title, and exit")
  args = parser.parse_args(argv)
  if args.write and args.only:
    parser.error("--write needs every scenario: run it without --only")
  return args


def main(argv: Optional[Sequence[str]] = None) -> None:
  args = parse_args(argv)
  scale = 10 if args.quick else 1
  # The barrier's first, in a fresh process (barrier_scenarios.py).
  every = (barrier_scenarios.scenarios(scale, args.repeat)
           + scenarios.scenarios(scale, args.repeat))
  try:
    page.check_ids(s.id for s in every)
  except ValueError as error:
    sys.exit(f"tools.bench: {error}")
  if args.list:
    print("\n".join(f"{s.id}: {s.title}" for s in every))
    return
  chosen = [s for s in every
            if re.search(args.only, s.id) or re.search(args.only, s.title)]
  transports = transport_policy.available_on_cpu()
  # Rows are in the outfeed mode unless they say "synchronous".
  jax.config.update("jax_host_callback_outfeed", True)
  rows: List[page.Row] = []
  for scenario in chosen:
    measured = scenario.rows(transports)
    if not measured:
      print(f"note: {scenario.id} is not measured here", file=sys.stderr)
    rows += [page.Row(scenario.id, title, scenario.unit, values)
             for title, values in measured]
  print(machine.describe())
  tables = [[r for r in rows if r.id not in page.BARRIER_IDS],
            [r for r in rows if r.id in page.BARRIER_IDS]]
  print("\n\n".join(page.format_table(t) for t in tables if t))
  if args.only:
    return
  try:
    text = page.page(rows, machine.describe())
  except ValueError as error:
    sys.exit(f"tools.bench: {error}")
  if args.write:
    with open(os.path.join(args.write, "benchmarks.md"), "w") as out:
      out.write(text)


if __name__ == "__main__":
  main()
