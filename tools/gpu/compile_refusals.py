"""Does XLA compile a step that taps a reduction of the product it returns,
on the default backend (a GPU's answer is the one of interest)?

    python -m tools.gpu.compile_refusals [--dump FOLDER]

On an H200 (jax 0.11.2, 2026-11-29) XLA refused such a step of 64x64
(`RET_CHECK failure ... hlo_computation.cc:680 instruction->IsDead()`), on
both transports, and compiled it at 256x256 (tests/test_never_breaks.py).
Each line here says, for each size, whether the step compiles and returns
the untapped step's values bitwise with: no tap, `jax.debug.callback`,
ordered `io_callback`, our tap on each transport, and our native tap in a
step that returns the product twice (a second use of it that XLA keeps,
as the CPU's end mark gives it). Our taps compile as users' do, through
the package's compile retry (on a GPU: the results behind an optimization
barrier, host_callback/primitive/compile_retry.py); "no retry" is XLA's
own answer, with the retry off. Then, for each of our
taps that XLA refused, whether it compiles with each of CANDIDATE_OPTIONS
added. With `--dump`, a refused tap is compiled once more in a process of
its own with XLA's per-pass dumps, and the line names the last passes XLA
finished before it gave up (the pass to blame runs right after them).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
from typing import Any, Callable, Dict, Optional, Tuple

SIZES = (64, 256)
WAYS = ("none", "debug.callback", "io_callback(ordered)", "tap python",
        "tap native", "tap native, ROOT a tuple", "tap python, no retry",
        "tap native, no retry")
# XLA GPU options that each turn off one candidate for the refusal: the
# Triton GEMM fusions, autotuning, cuBLASLt epilogue fusion.
CANDIDATE_OPTIONS: Tuple[Dict[str, Any], ...] = (
    {"xla_gpu_enable_triton_gemm": False},
    {"xla_gpu_autotune_level": 0},
    {"xla_gpu_enable_cublaslt": False},
)


def _step(way: str) -> Callable[..., Any]:
  """The step: returns tanh(x @ w), observing sum of it by `way`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.experimental import io_callback  # pylint: disable=import-outside-toplevel
  import host_callback as hcb  # pylint: disable=import-outside-toplevel

  def observe(v: Any) -> None:
    if way == "debug.callback":
      jax.debug.callback(lambda a: None, v)
    elif way == "io_callback(ordered)":
      io_callback(lambda a: None, None, v, ordered=True)
    elif way.startswith("tap"):
      hcb.id_tap(lambda a, t: None, v)

  def step(x: Any, w: Any) -> Any:
    y = jnp.tanh(x @ w)
    observe(jnp.sum(y))
    # "ROOT a tuple": a second use of y that XLA keeps, as the CPU's end
    # mark gives it (docs/xla_root_fusion.md); its refusal is then the
    # same bug as the CPU's.
    return (y, y) if way.endswith("ROOT a tuple") else y
  return step


def _inputs(size: int) -> Tuple[Any, Any]:
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(size)
  return tuple(jnp.asarray(rng.standard_normal((size, size)), jnp.float32) / 8
               for _ in range(2))


def try_compile(way: str, size: int,
                options: Optional[Dict[str, Any]] = None) -> str:
  """'ok', 'values differ', or the refusal's first line."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import host_callback as hcb  # pylint: disable=import-outside-toplevel
  from host_callback.primitive import compile_retry  # pylint: disable=import-outside-toplevel
  if way.startswith("tap"):
    jax.config.update("jax_host_callback_transport",
                      way.split()[1].rstrip(","))
  retries = dict(compile_retry.RETRIES)
  if way.endswith("no retry"):
    compile_retry.RETRIES.clear()
  x, w = _inputs(size)
  try:
    compiled = jax.jit(_step(way)).lower(x, w).compile(
        compiler_options=options)
    out = compiled(x, w)
    out = np.asarray(out[0] if isinstance(out, tuple) else out)
    hcb.barrier_wait()
    jax.effects_barrier()
  except Exception as error:  # pylint: disable=broad-except
    return "refused: " + (str(error).strip().splitlines() or [""])[0][:160]
  finally:
    compile_retry.RETRIES.update(retries)
  expected = np.asarray(jax.jit(_step("none"))(x, w))
  return "ok" if np.array_equal(out, expected) else "values differ"


def last_passes(way: str, size: int, folder: str, count: int = 3) -> str:
  """The last `count` passes XLA dumped for the step before it gave up,
  compiling it in a child process with per-pass dumps into `folder`."""
  flags = (f"--xla_dump_to={folder} --xla_dump_hlo_pass_re=.* "
           "--xla_dump_hlo_module_re=.*step.*")
  env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " +
                                    flags).strip())
  subprocess.run([sys.executable, "-m", __spec__.name, "--case", way,
                  str(size)], env=env, capture_output=True, timeout=120,
                 check=False)
  numbered = []
  for path in glob.glob(os.path.join(folder, "*.txt")):
    found = re.search(r"\.(\d{4})\.([^.]+)\.after_([^.]+)\.before_([^.]+)",
                      os.path.basename(path))
    if found:
      numbered.append((int(found.group(1)), found.group(3),
                       found.group(4)))
  if not numbered:
    return "no pass dumps"
  last = sorted(numbered)[-count:]
  return "; ".join(f"after {done} (next: {then})" for _, done, then in last)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dump", metavar="FOLDER",
                      help="for each refused tap, the last passes XLA ran")
  parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  import jax  # pylint: disable=import-outside-toplevel
  import host_callback  # pylint: disable=import-outside-toplevel,unused-import  (its settings)
  jax.config.update("jax_host_callback_outfeed", True)
  if args.case:
    print(try_compile(args.case[0], int(args.case[1])), flush=True)
    return
  backend = jax.default_backend()
  for size in SIZES:
    for way in WAYS:
      outcome = try_compile(way, size)
      print(f"{backend}: {size}x{size}, {way}: {outcome}", flush=True)
      if not (outcome.startswith("refused") and way.startswith("tap")):
        continue
      for options in CANDIDATE_OPTIONS:
        print(f"{backend}: {size}x{size}, {way}, with {options}: "
              f"{try_compile(way, size, options)}", flush=True)
      if args.dump:
        folder = os.path.join(args.dump,
                              re.sub(r"\W+", "_", way) + f"_{size}")
        print(f"{backend}: {size}x{size}, {way}: XLA's last passes: "
              f"{last_passes(way, size, folder)}", flush=True)


if __name__ == "__main__":
  main()
