"""`python -m tools.gpu_check` where JAX has no CUDA backend: a clear "no
GPU" message, a report that says so, and exit status 2 (nothing
validated, which is not a pass)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_says_no_gpu(tmp_path, transport):
  if transport != "python":
    pytest.skip("runs once: the transport does not matter here")
  report = tmp_path / "report.md"
  done = subprocess.run(
      [sys.executable, "-m", "tools.gpu_check", "--report", str(report)],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 2, done.stdout + done.stderr
  assert "gpu_check: no GPU" in done.stdout
  assert "NO GPU" in report.read_text()
