"""Steps with taps and calls loaded from JAX's persistent compilation cache in
a fresh process work as when they were compiled: the host functions run,
in order, with their values. Runs on the default backend (a GPU where it is
one: `python -m tools.gpu_check` runs it there)."""

from helpers import run_python

CHILD = """
import sys
import jax
import jax.numpy as jnp
import host_callback as hcb

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
hits = []
jax.monitoring.register_event_listener(
    lambda name, **_: hits.append(name) if name.endswith("cache_hits") else None)

def step(x):
  x = hcb.id_tap(lambda a, _: print("tap", a.tolist(), flush=True), x * 2)
  y = hcb.call(lambda a: a + 1, x, result_shape=x)
  return hcb.id_print(y, what="y")

out = jax.jit(step)(jnp.arange(3.0))
hcb.barrier_wait()
print("out", out.tolist(), flush=True)
print("cache hits", len(hits))
"""


def test_a_step_from_the_persistent_cache_runs_its_taps_and_calls(
    tmp_path, both_modes, transport):
  cache = str(tmp_path / "cache")
  mode = {"JAX_HOST_CALLBACK_OUTFEED": "1" if both_modes == "outfeed" else "0",
          "JAX_PLATFORMS": None}  # the default backend, as the parent's
  runs = []
  for _ in range(2):
    done = run_python(f"import sys; sys.argv[1:] = [{cache!r}]\n" + CHILD,
                      env=mode, transport=transport)
    assert done.returncode == 0, done.stderr
    runs.append(done.stdout.splitlines())
  expected = ["tap [0.0, 2.0, 4.0]", "what: y", "[1. 3. 5.]",
              "out [1.0, 3.0, 5.0]"]
  assert runs[0] == expected + ["cache hits 0"]
  hits = runs[1].pop()
  assert runs[1] == expected
  assert hits != "cache hits 0", "the second process compiled again"
