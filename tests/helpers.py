"""Shared test helpers: a recording tap function, stdout capture, subprocesses."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
from host_callback import settings

SUBPROCESS_TIMEOUT = 120  # seconds; a hang fails the test instead of the run
OUTFEED = {"JAX_HOST_CALLBACK_OUTFEED": "1"}  # run_python's env for that mode


class Recorder:
  """A tap function that records every call.

  `calls` holds `(arg, transforms, device)` tuples in arrival order (`device`
  is None unless the tap was made with `tap_with_device=True`).
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self.calls: List[Tuple[Any, Any, Any]] = []

  def __call__(self, arg: Any, transforms: Any, *, device: Any = None) -> None:
    with self._lock:
      self.calls.append((arg, transforms, device))

  @property
  def args(self) -> List[Any]:
    return [arg for arg, _, _ in self.calls]

  @property
  def transforms(self) -> List[Any]:
    return [transforms for _, transforms, _ in self.calls]

  @property
  def devices(self) -> List[Any]:
    return [device for _, _, device in self.calls]

  def by_device(self) -> Dict[int, List[Any]]:
    """The args as Python values, in arrival order, by device id."""
    result: Dict[int, List[Any]] = {}
    for arg, _, device in self.calls:
      result.setdefault(device.id, []).append(np.asarray(arg).tolist())
    return result


def batch(*dims: Optional[int]) -> Tuple[str, Dict[str, Any]]:
  """The `transforms` entry that one `vmap` adds."""
  return ("batch", {"batch_dims": tuple(dims)})


def assert_tree_equal(actual: Any, expected: Any) -> None:
  """Same pytree structure, and leaves equal as arrays with the same dtype."""
  actual_leaves, actual_def = jax.tree_util.tree_flatten(actual)
  expected_leaves, expected_def = jax.tree_util.tree_flatten(expected)
  assert actual_def == expected_def, (actual, expected)
  for a, e in zip(actual_leaves, expected_leaves):
    assert isinstance(a, np.ndarray), (type(a), a)
    e = np.asarray(e)
    assert a.dtype == e.dtype, (a.dtype, e.dtype, actual)
    np.testing.assert_array_equal(a, e)


@contextlib.contextmanager
def captured_stdout() -> Iterator[io.StringIO]:
  """Redirects `sys.stdout` (for every thread), as the golden files were made.

  The barrier runs inside, so that prints from receiver threads land here.
  """
  stream = io.StringIO()
  with contextlib.redirect_stdout(stream):
    yield stream
    hcb.barrier_wait()


def cpu_devices(n: int) -> List[Any]:
  """The first `n` CPU devices (conftest.py asks XLA for 4), whatever the
  default backend is; skips the test when there are fewer."""
  devices = jax.devices("cpu")
  if len(devices) < n:
    pytest.skip(f"needs {n} CPU devices, has {len(devices)}")
  return devices[:n]


@contextlib.contextmanager
def on_a_cpu_device() -> Iterator[None]:
  """Computations run on a CPU device whatever the default backend is (a
  GPU on the GPU machine). Set globally, so that the arrays and functions
  that host functions make on receiver threads are on the CPU too."""
  previous = jax.config.jax_default_device
  jax.config.update("jax_default_device", cpu_devices(1)[0])
  try:
    yield
  finally:
    jax.config.update("jax_default_device", previous)


def compiled_modules(monkeypatch: Any) -> List[Tuple[Any, Any]]:
  """From now on, (module, compile options) of each compile that XLA took,
  in order: JAX's compile of a module (jax._src.compiler.
  compile_or_get_cached, below the package's compile wrapper) is
  watched."""
  from jax._src import compiler  # pylint: disable=import-outside-toplevel
  seen: List[Tuple[Any, Any]] = []
  compile_ = compiler.compile_or_get_cached

  def watched(backend, computation, devices, compile_options, *args, **kw):
    executable = compile_(backend, computation, devices, compile_options,
                          *args, **kw)
    seen.append((computation, compile_options))
    return executable
  monkeypatch.setattr(compiler, "compile_or_get_cached", watched)
  return seen


@jax.jit
def keep_busy(x: jax.Array) -> jax.Array:
  """A computation without callbacks that keeps a CPU device busy for about
  0.1-0.3 s on a 700x700 `x`: what it returns is not ready when a later
  one is dispatched."""
  return jax.lax.fori_loop(0, 30, lambda i, y: jnp.tanh(y @ y), x)


def needs_cpu_default_backend(why: str) -> None:
  """Skips the test, saying `why`, unless JAX's default backend is CPU."""
  if jax.default_backend() != "cpu":
    pytest.skip(f"{why} (the default backend is {jax.default_backend()})")


@contextlib.contextmanager
def no_barrier_probe_on(monkeypatch: Any, number: int) -> Iterator[None]:
  """Meanwhile the CPU device of number `number` gets no barrier probe, as
  a device that is not a CPU (a GPU) gets none: the barrier waits for it
  with a marker tap through its queue instead."""
  from host_callback.barrier import probes  # pylint: disable=import-outside-toplevel
  # pylint: disable=protected-access
  probe_on = probes._probe_on
  monkeypatch.setattr(probes, "_probe_on", lambda n, *readable: (
      None if n == number else probe_on(n, *readable)))
  probes._probes.cache_clear()
  try:
    yield
  finally:
    probes._probes.cache_clear()


def linux_only_calls_built() -> bool:
  """Whether the native module makes its Linux-only calls: built on Linux
  without HOST_CALLBACK_PORTABLE=1 (setup.py), which the tests of a
  portable build see too (CI sets it for both)."""
  return (sys.platform.startswith("linux")
          and os.environ.get("HOST_CALLBACK_PORTABLE") != "1")


def synchronous() -> bool:
  """Whether taps on the default backend run in the synchronous mode now
  (conftest.py chooses the mode; there is one on CPU only)."""
  return not settings.outfeed_mode(jax.default_backend())


@contextlib.contextmanager
def fails_when_synchronous(match: str = "") -> Iterator[None]:
  """Around code whose tap function raises: in the synchronous mode the
  computation that ran the tap fails (a JaxRuntimeError whose message matches
  `match`), and that is the only report; in the outfeed mode it completes,
  and only `barrier_wait` reports the error (see `barrier_report`)."""
  if synchronous():
    with pytest.raises(jax.errors.JaxRuntimeError, match=match):
      yield
  else:
    yield


def barrier_report() -> Optional[BaseException]:
  """`barrier_wait()` after a tap function raised: in the outfeed mode it
  raises the CallbackException, which this returns; in the synchronous mode
  the failed computation was the only report (issue 24, item 4), so it
  raises nothing and this returns None."""
  if synchronous():
    hcb.barrier_wait()
    return None
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  return info.value


def device_str(index: int) -> str:
  """How `id_print` shows the device `jax.devices()[index]` (of the default
  backend; `str(device)` for one of `cpu_devices`)."""
  return str(jax.devices()[index])


def print_blocks(text: str, lines_per_block: int) -> List[str]:
  """Splits printed text into prints of `lines_per_block` lines each."""
  lines = text.splitlines(keepends=True)
  assert len(lines) % lines_per_block == 0, text
  return ["".join(lines[i:i + lines_per_block])
          for i in range(0, len(lines), lines_per_block)]


# For run_python code: `outcome(wait)` sends Ctrl-C to the process in
# `after` seconds, runs `wait()`, and says how it ended. Ctrl-C that stopped
# a host function is re-armed for the waiting thread, so KeyboardInterrupt
# comes either at once or while Python handles the failed computation's
# error (on JAX's C++ dispatch path, which raises that error directly).
# CTRL_C_INTERRUPTED lists the outcomes that mean KeyboardInterrupt reached it.
CTRL_C_INTERRUPTED = ("KeyboardInterrupt", "an error, then KeyboardInterrupt")
CTRL_C_OUTCOME = """
import os, signal, threading

def outcome(wait, after=1.0):
  threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()
  try:
    try:
      wait()
      return "returned"
    except KeyboardInterrupt:
      return "KeyboardInterrupt"
    except Exception as error:
      for _ in range(3):  # Python checks for pending signals here
        pass
      return (f"{type(error).__name__}, naming it: "
              f"{'KeyboardInterrupt' in str(error)}")
  except KeyboardInterrupt:  # raised while Python handled the error
    return "an error, then KeyboardInterrupt"
"""


def run_python(code: str, env: Optional[Dict[str, Optional[str]]] = None,
               transport: Optional[str] = None,
               timeout: float = SUBPROCESS_TIMEOUT
               ) -> subprocess.CompletedProcess:
  """Runs `code` in a fresh interpreter; returns the finished process.

  The child inherits XLA_FLAGS (4 CPU devices), runs on CPU only
  (JAX_PLATFORMS=cpu), uses `transport` and the default (synchronous) mode;
  `env` adds variables (`OUTFEED` for the outfeed mode), or removes those it
  maps to None.
  """
  child_env = dict(os.environ)
  child_env.pop("JAX_HOST_CALLBACK_INLINE", None)
  child_env.pop("JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE", None)
  child_env.pop("JAX_HOST_CALLBACK_OUTFEED", None)  # the default mode
  child_env["JAX_PLATFORMS"] = "cpu"
  if transport is not None:
    child_env["JAX_HOST_CALLBACK_TRANSPORT"] = transport
  for name, value in (env or {}).items():
    if value is None:
      child_env.pop(name, None)
    else:
      child_env[name] = value
  return subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)], env=child_env,
      capture_output=True, text=True, timeout=timeout, check=False)


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
  """Polls `condition` until it holds, or `timeout` seconds passed (a guard
  against hanging, not a timed assertion); returns whether it holds."""
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


def run_in_terminal(code: str, env: Optional[Dict[str, str]] = None,
                    columns: int = 120, lines: int = 40) -> List[str]:
  """Runs `code` as `run_python` does, but with stdout and stderr on a
  pseudo-terminal of `columns` x `lines`; returns the screen a person sees
  when it has ended (pyte plays the bytes), without the blank lines at its
  end."""
  import pyte  # pylint: disable=import-outside-toplevel  (a test extra)
  child_env = dict(os.environ, JAX_PLATFORMS="cpu", TERM="xterm",
                   COLUMNS=str(columns), LINES=str(lines))
  child_env.pop("JAX_HOST_CALLBACK_OUTFEED", None)
  child_env.update(env or {})
  leader, follower = pty.openpty()
  fcntl.ioctl(follower, termios.TIOCSWINSZ,
              struct.pack("HHHH", lines, columns, 0, 0))
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-c", textwrap.dedent(code)], env=child_env,
      stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
  os.close(follower)
  output = bytearray()
  while True:
    try:
      data = os.read(leader, 65536)
    except OSError:  # the child closed the terminal
      break
    if not data:
      break
    output += data
  os.close(leader)
  assert process.wait(timeout=SUBPROCESS_TIMEOUT) == 0, output.decode()
  screen = pyte.Screen(columns, lines)
  stream = pyte.Stream(screen)
  stream.feed(output.decode())
  shown = [line.rstrip() for line in screen.display]
  while shown and not shown[-1]:
    shown.pop()
  return shown
