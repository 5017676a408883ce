"""The watchdog of a compile that a host function starts on a GPU, where it
can deadlock (docs/gpu.md, "Compiling in a host function"): after a while
it says why and what to do. On CPU nothing deadlocks, so these tests watch
the CPU, with no delay."""

import logging

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
from host_callback.primitive import compile_watch

from helpers import compiled_modules, on_a_cpu_device, wait_until


@pytest.fixture
def watched_cpu(monkeypatch, caplog):
  """The CPU is watched, and the tests' computations run on a CPU device
  (on the GPU machine too)."""
  monkeypatch.setattr(compile_watch, "WATCHED_PLATFORMS", frozenset({"cpu"}))
  monkeypatch.setattr(compile_watch, "WARN_AFTER_SECONDS", 0.0)
  caplog.set_level(logging.WARNING, logger="host_callback")
  with on_a_cpu_device():
    yield caplog


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records
          if "has been compiling a JAX function" in r.getMessage()]


def _fresh_function():
  """A function never compiled before, long enough to compile for the
  timer to fire first."""
  return jax.jit(lambda v: sum(jnp.sin(v * i) for i in range(40)))


def test_a_long_compile_in_a_call_names_the_deadlock_and_the_ways_out(
    watched_cpu):
  def host(a):
    return a + 0 * _fresh_function()(a)

  out = jax.jit(lambda v: hcb.call(host, v, result_shape=v))(jnp.float32(2))
  assert float(out) == 2.
  assert wait_until(lambda: _warnings(watched_cpu), timeout=10)
  message = _warnings(watched_cpu)[0]
  assert message.startswith(
      "host_callback: a host function has been compiling a JAX function "
      "for the cpu for 0 s while the computation that runs it waits for it.")
  assert "jax.jit(f).lower(...).compile()" in message
  assert message.endswith(
      "host_callback leaves autotuning out of such a compile, as "
      "jax.jit(f, compiler_options={'xla_gpu_autotune_level': 0}) does, "
      "unless its compiler_options or XLA_FLAGS set a level.")


def test_a_compile_outside_host_functions_is_not_watched(watched_cpu):
  _fresh_function()(jnp.float32(2)).block_until_ready()
  assert _warnings(watched_cpu) == []


@pytest.mark.parametrize("validated, xla_flags", [
    (False, ""), (True, ""), (True, "--xla_gpu_autotune_level=3")])
def test_a_compile_in_a_host_function_leaves_out_autotuning_once_validated(
    watched_cpu, monkeypatch, validated, xla_flags):
  """Where NO_AUTOTUNE_VALIDATED, a compile started by a host function on a
  watched platform gets xla_gpu_autotune_level 0 unless it sets that
  option itself, or XLA_FLAGS does; a compile outside host functions
  never does."""
  monkeypatch.setattr(compile_watch, "NO_AUTOTUNE_VALIDATED", validated)
  monkeypatch.setenv("XLA_FLAGS", xla_flags)  # read at each compile

  def host(a):
    _fresh_function()(a).block_until_ready()
    jax.jit(lambda v: v * 5, compiler_options={"xla_gpu_autotune_level": 2}
            )(a).block_until_ready()
    return a

  two, three = jnp.float32(2), jnp.float32(3)  # compiled before: not counted
  compiled = compiled_modules(monkeypatch)
  jax.jit(lambda v: hcb.call(host, v, result_shape=v))(two)
  _fresh_function()(three).block_until_ready()
  levels = [dict(options.env_option_overrides).get("xla_gpu_autotune_level")
            for _, options in compiled]
  # the step, the host function's two functions, the one outside
  assert levels == [None, 0 if validated and not xla_flags else None, 2,
                    None]
