"""The CUDA transport's host side, on CPU, against a stand-in for the CUDA
runtime (tests/cuda_standin/standin.cc): the stand-in completes copies and
events on its own thread, late and out of step with the caller, and fails
on demand. Each scenario (tests/cuda_standin/scenarios.py) runs in a process
of its own, since the stand-in is installed process-wide. What only a GPU
runs (the stream and device pointers from XLA's call frame, ffi_cuda.cc) is
checked by `python -m tools.gpu.check` on a GPU machine.
"""

import os
import shutil
import subprocess
import sys
import sysconfig

import jax
import pytest

from host_callback.receiver import native_library

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(os.path.dirname(HERE), "receiver", "native")


@pytest.fixture(autouse=True)
def native_only(transport):
  if transport != "native":
    pytest.skip("exercises the native transport's CUDA part")


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
  """The stand-in library, built for this test run."""
  if not native_library.available():
    pytest.skip("the native transport is not built")
  compiler = shutil.which((sysconfig.get_config_var("CXX") or "c++").split()[0])
  if compiler is None:
    pytest.skip("no C++ compiler for the CUDA stand-in")
  path = str(tmp_path_factory.mktemp("cuda_standin") / "libhcb_standin.so")
  subprocess.run(
      [compiler, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread",
       "-I", NATIVE, os.path.join(HERE, "cuda_standin", "standin.cc"),
       "-o", path], check=True)
  return path


@pytest.mark.parametrize("scenario", [
    "order", "bound", "failures", "barrier", "stop", "call", "large_calls",
    "exit_pending", "buffers"])
def test_cuda_host_side(standin, scenario):
  """order: taps in flight land in order with their bytes, pool blocks are
  reused only after their copies, an idle landing thread burns no CPU;
  bound: the queue bound counts copies in flight; failures: a failing CUDA
  call is an error naming it, nothing left half-enqueued; barrier and stop
  with copies pending; call: copy in, reply, copy out; large_calls: calls
  larger than the bound pin no new memory after the first; exit_pending:
  the interpreter exits with copies pending; buffers: a buffers=True call
  on the GPU's own buffers (exports, stream=, out=, a result copied on
  the device, errors), and behind taps in flight: after them, on the
  GPU's buffers and stream."""
  env = dict(os.environ, HOST_CALLBACK_ALLOW_CUDA_STANDIN="1",
             JAX_PLATFORMS="cpu")
  done = subprocess.run(
      [sys.executable, os.path.join(HERE, "cuda_standin", "scenarios.py"),
       scenario, standin], env=env, capture_output=True, text=True,
      timeout=120)
  assert done.returncode == 0 and f"PASS {scenario}" in done.stdout, (
      done.stdout + done.stderr)


def test_standin_needs_the_tests_permission(standin, monkeypatch):
  """No user's process installs the stand-in by accident."""
  monkeypatch.delenv("HOST_CALLBACK_ALLOW_CUDA_STANDIN", raising=False)
  with pytest.raises(RuntimeError, match="HOST_CALLBACK_ALLOW_CUDA_STANDIN"):
    native_library.native._testing_cuda_standin(standin)


def test_cuda_handlers_are_built_without_cuda():
  """The CUDA handlers exist in every build (no CUDA toolkit needed)."""
  if not native_library.available():
    pytest.skip("the native transport is not built")
  assert set(native_library.cuda_ffi_handlers()) == {
      native_library.OUTFEED_TARGET, native_library.CALL_TARGET}


def test_cuda_runtime_not_found_is_a_clear_error():
  """Without a CUDA runtime, finding it fails saying what is missing and
  what to do (with one, it is found: nothing to check here)."""
  if not native_library.available():
    pytest.skip("the native transport is not built")
  try:
    native_library.load_cuda_runtime()
  except RuntimeError as error:
    assert "libcudart" in str(error) and "jax[cuda12]" in str(error)
