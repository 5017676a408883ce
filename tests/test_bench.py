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
  rows = [page.Row(s.id, s.title, s.unit, {"hcb[native]": 1.0})
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
