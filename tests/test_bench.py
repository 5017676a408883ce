"""`python -m tools.bench` without measuring: every id that the page's
summary and topics name is a scenario's, each scenario is in one topic,
a summary row whose scenario was not measured fails, and `--write` is
refused with `--only`."""

import pathlib
import subprocess
import sys

import pytest

from tools.bench import barrier_scenarios, page, scenarios

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def once(transport):
  if transport != "python":
    pytest.skip("runs once: the transport does not matter here")


def _every():
  return barrier_scenarios.scenarios(10, 1) + scenarios.scenarios(10, 1)


def test_the_page_names_scenarios_by_known_ids():
  ids = [s.id for s in _every()]
  assert len(ids) == len(set(ids))
  page.check_ids(ids)
  with pytest.raises(ValueError, match="unknown scenario id 'step-tap'"):
    page.check_ids([i for i in ids if i != "step-tap"])


def test_a_summary_scenario_not_measured_fails():
  rows = [page.Row(s.id, s.title, s.unit, {"hcb[native]": 1.0, "floor": 1.0})
          for s in _every()]
  assert page.summary_table(rows).count("\n") == len(page.SUMMARY) + 1
  with pytest.raises(ValueError, match="'scan-call', which was not measured"):
    page.summary_table([r for r in rows if r.id != "scan-call"])


def test_write_is_refused_with_only():
  done = subprocess.run(
      [sys.executable, "-m", "tools.bench", "--only", "x", "--write", "docs"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2
  assert "--write needs every scenario" in done.stderr


def test_the_floors_run_and_the_summary_puts_each_hot_row_beside_its_floor():
  """The floor scenarios measure (tiny sizes; nothing timed is checked),
  the summary gives each hot row's ratio to its floor, and a hot row
  whose floor was not measured fails the summary."""
  from host_callback.receiver import native_library  # pylint: disable=import-outside-toplevel
  if not native_library.available():
    pytest.skip("the floors are the native module's")
  every = [s for s in scenarios.scenarios(1000, 1) if s.id in
           ("scan-floor-dispatch", "scan-floor-python")]
  assert len(every) == 2
  for scenario in every:
    values = scenario.measure(["native"])
    assert set(values) == {"floor", "bare scan"}
  rows = [page.Row(s.id, s.title, s.unit, {"hcb[native]": 1.0, "floor": 0.5})
          for s in _every()]
  hot = {question for question, i, _, _ in page.SUMMARY if i in page.FLOORS}
  assert len(hot) == len(page.FLOORS) == 3
  last_cells = {line.split(" | ")[0][2:]: line.split(" | ")[-1]
                for line in page.summary_table(rows).splitlines()[2:]}
  assert {q: c for q, c in last_cells.items() if c != " |"} == {
      q: "2.0x (`scan-floor-python`: 0.5 µs) |" for q in hot}
  with pytest.raises(ValueError, match="'scan-floor-python', which was not"):
    page.summary_table([r for r in rows if r.id != "scan-floor-python"])
