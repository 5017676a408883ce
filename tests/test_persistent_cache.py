"""Steps with taps and calls loaded from JAX's persistent compilation cache in
a fresh process work as when they were compiled: the host functions run,
in order, with their values. Runs on the default backend (a GPU where it is
one: `python -m tools.gpu.check` runs it there)."""

import pytest

from helpers import run_python

CHILD = """
import logging
import sys
import jax
import jax.numpy as jnp
import host_callback as hcb

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


class StepCache(logging.Handler):
  # What JAX's compiler logs of the step's cache entry.
  said = "miss"

  def emit(self, record):
    message = record.getMessage()
    if "'jit_step'" not in message:
      return
    if "cache hit" in message:
      StepCache.said = "hit"
    elif "uses host callbacks" in message:
      StepCache.said = "not written: host callbacks"


compiler_log = logging.getLogger("jax._src.compiler")
compiler_log.setLevel(logging.DEBUG)
compiler_log.addHandler(StepCache())

def step(x):
  x = hcb.id_tap(lambda a, _: print("tap", a.tolist(), flush=True), x * 2)
  y = hcb.call(lambda a: a + 1, x, result_shape=x)
  return hcb.id_print(y, what="y")

out = jax.jit(step)(jnp.arange(3.0))
hcb.barrier_wait()
print("out", out.tolist(), flush=True)
print("cache", StepCache.said)
"""


def test_a_step_from_the_persistent_cache_runs_its_taps_and_calls(
    tmp_path, both_modes, transport):
  cache = str(tmp_path / "cache")
  mode = {"JAX_HOST_CALLBACK_OUTFEED": "1" if both_modes == "outfeed" else "0",
          "JAX_PLATFORMS": None}  # the default backend, as the parent's
  expected = ["tap [0.0, 2.0, 4.0]", "what: y", "[1. 3. 5.]",
              "out [1.0, 3.0, 5.0]"]
  runs = []
  for _ in range(2):
    done = run_python(f"import sys; sys.argv[1:] = [{cache!r}]\n" + CHILD,
                      env=mode, transport=transport)
    assert done.returncode == 0, done.stderr
    runs.append(done.stdout.splitlines())
    assert runs[-1][:-1] == expected
    if runs[0][-1] == "cache not written: host callbacks":
      pytest.skip("this JAX does not cache computations with host callbacks "
                  "(jax 0.10): the step compiles again in a fresh process")
  assert runs[0][-1] == "cache miss"
  assert runs[1][-1] == "cache hit", "the second process compiled the step"
