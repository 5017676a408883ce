"""While a host function blocks a computation's launch, can JAX compile
for the same device? Prints one line per case, on the default backend (a
GPU's answer is the one of interest):

    python -m tools.gpu.compile_during_call [--wait SECONDS] [--own-only]

Each case runs in a process of its own, AT_A_TIME at a time: a jitted
`call` (native or python transport) or `jax.pure_callback` whose host
function waits up to `--wait` seconds (WAIT_SECONDS) for a second thread,
which meanwhile compiles, compiles and runs, or runs an already compiled
function on the default device, puts an array there, or runs a function on
the CPU. "ok" means the second thread finished while the host function
waited; "BLOCKED" that it did not. On an H200 with jax 0.11.2, the cases
that compile for the GPU were blocked, on every transport and with
`pure_callback` (docs/architecture.md, "The CUDA part"). A batch of
cases ends within `--wait` + CASE_SLACK_SECONDS seconds: a case still
running then is killed and reported as failed.

Two more cases per transport ask what a user meets: the call's host
function compiles and runs a new function itself ("own"), and a tap just
before the call does ("tap before"; the call waits for that tap). "ok"
means the computation finished; "HUNG" that it outlived the wait, with
every thread's native stack (gdb or cuda-gdb, `tools/gpu/native_stacks.py`,
grouped; `--stacks FOLDER` keeps each whole) and Python stack
(`tools/gpu/hung_cases.py`). The "own" case also runs with `pure_callback` and
`io_callback` (unordered and ordered): on an H200 (jax 0.11.2) it hung on
both our transports and not with JAX's callbacks (docs/gpu.md); and with
`pure_callback` and ordered `io_callback` after our taps and calls ran on
both transports ("own_after_ours"), which tells whether our runtime's
presence alone makes JAX's callbacks hang too, beside the same after as
many computations with JAX's callbacks ("own_after_jax"). On 2026-11-29
those did not hang and ours did: the autotuner's profiling waits for the
GPU's exclusive lock, which the launching thread holds while the host
function runs (docs/gpu.md). "own_no_autotune" compiles with
`xla_gpu_autotune_level=0`, the workaround that the package's warning
names (host_callback/primitive/compile_watch.py); "own_auto_no_autotune"
compiles with no option, the package adding that one
(`compile_watch.NO_AUTOTUNE_VALIDATED`, on since these cases passed on an
H200, 2026-11-30), and "tap_before_auto" is "tap before" so; the other
cases run with it off, as before it.
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
import os
import sys
import threading
import time

from . import hung_cases

CALLS = ("native", "python", "pure_callback")
WORK = ("compile_run", "run", "compile", "put", "cpu")
# The cases where the host functions compile themselves: (call, where).
# JAX's io_callback, ordered and not, tells whether a hang is ours or any
# ordered callback's.
# JAX's own callbacks run once more after our taps and calls ran on both
# transports ("own_after_ours"), and, as its control, after as many
# computations with JAX's callbacks ran ("own_after_jax"): whether our
# runtime's presence (its threads, its CUDA state) is what hangs, or our
# programs and host path.
OWN = tuple(itertools.product(
    CALLS + ("io_callback", "io_callback_ordered"), ("own",))) + (
        ("native", "tap_before"), ("python", "tap_before"),
        ("native", "own_no_autotune"), ("python", "own_no_autotune"),
        ("native", "own_auto_no_autotune"),
        ("python", "own_auto_no_autotune"), ("native", "tap_before_auto"),
        ("python", "tap_before_auto")) + tuple(
            itertools.product(("pure_callback", "io_callback_ordered"),
                              ("own_after_ours", "own_after_jax")))
WAIT_SECONDS = 20
AT_A_TIME = 4
# What a batch of cases may take beyond `--wait`: starting JAX in each of
# its processes and compiling, before the host function waits.
CASE_SLACK_SECONDS = 30


def own_case(call: str, where: str) -> str:
  """Runs one case where a host function compiles and runs a new JAX
  function for the default device: the call's own ("own"), or a tap's just
  before the call ("tap_before")."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import host_callback as hcb  # pylint: disable=import-outside-toplevel
  from jax.experimental import io_callback  # pylint: disable=import-outside-toplevel

  # "own_no_autotune": the workaround that compile_watch's warning names.
  options = ({"xla_gpu_autotune_level": 0} if where == "own_no_autotune"
             else None)
  # "..._auto...": the package adds that option itself.
  from host_callback.primitive import compile_watch  # pylint: disable=import-outside-toplevel
  compile_watch.NO_AUTOTUNE_VALIDATED = where in ("own_auto_no_autotune",
                                                  "tap_before_auto")

  def compile_and_run(a):
    fresh = jax.jit(lambda v: jnp.sum(v) * 2 + 1,  # never compiled before
                    compiler_options=options)
    return float(fresh(jnp.asarray(a)))

  host = lambda a: np.asarray(a) + 0 * compile_and_run(a)  # noqa: E731
  if where == "own_after_ours":
    for transport in ("python", "native"):
      jax.config.update("jax_host_callback_transport", transport)
      jax.block_until_ready(jax.jit(lambda v: hcb.call(
          lambda a: a, hcb.id_tap(lambda *_: None, v), result_shape=v))(
              jnp.arange(4.0)))
      hcb.barrier_wait()
  elif where == "own_after_jax":  # as many compiles and callbacks, JAX's
    for ordered in (False, True):
      jax.block_until_ready(jax.jit(lambda v, o=ordered: io_callback(
          lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype),
          jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(
              v.shape, v.dtype), v), ordered=o))(jnp.arange(4.0)))
      jax.effects_barrier()
  # Where a case hangs, every thread's Python stack goes to stderr, and the
  # case runs on (run alone, for ever): hung_cases takes its native
  # stacks, prints both and ends it.
  faulthandler.dump_traceback_later(WAIT_SECONDS)
  if call == "pure_callback":
    f = jax.jit(lambda v: jax.pure_callback(
        host, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
  elif call.startswith("io_callback"):
    f = jax.jit(lambda v: io_callback(
        host, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
        ordered=call.endswith("ordered")))
  else:
    jax.config.update("jax_host_callback_transport", call)
    if where in ("own", "own_no_autotune", "own_auto_no_autotune"):
      f = jax.jit(lambda v: hcb.call(host, v, result_shape=v))
    else:
      f = jax.jit(lambda v: hcb.call(
          lambda a: a, hcb.id_tap(lambda a, _: compile_and_run(a), v),
          result_shape=v))
  start = time.perf_counter()
  np.asarray(f(jnp.arange(4.0)))
  hcb.barrier_wait()
  whose = {"own": "own host function",
           "own_no_autotune": "own host function (autotune level 0)",
           "own_auto_no_autotune":
               "own host function (autotune level 0 by the package)",
           "own_after_ours": "own host function (after ours ran)",
           "own_after_jax": "own host function (after JAX's ran)",
           "tap_before": "preceding tap",
           "tap_before_auto": "preceding tap (autotune level 0 by the "
                              "package)"}[where]
  return (f"{jax.default_backend()}: a {call} call whose {whose} "
          f"compiles: ok ({time.perf_counter() - start:.2f} s)")


def one_case(call: str, work: str) -> str:
  """Runs one case in this process; returns its line."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import host_callback as hcb  # pylint: disable=import-outside-toplevel

  x = jnp.arange(4.0)
  compiled = jax.jit(lambda v: v * 3)
  compiled(x).block_until_ready()
  entered, finished = threading.Event(), threading.Event()

  def second_thread():
    entered.wait()
    if work == "compile_run":
      jax.jit(lambda v: jnp.sum(v) + 7)(x).block_until_ready()
    elif work == "run":
      compiled(x).block_until_ready()
    elif work == "compile":
      jax.jit(lambda v: jnp.sum(v) + 8).lower(x).compile()
    elif work == "put":
      jax.device_put(np.arange(4.0), x.device).block_until_ready()
    else:
      cpu = jax.devices("cpu")[0]
      jax.jit(lambda v: jnp.sum(v) + 9)(
          jax.device_put(np.arange(4.0), cpu)).block_until_ready()
    finished.set()

  def host(a):
    entered.set()
    return np.asarray(a) + (0 if finished.wait(WAIT_SECONDS) else -1)

  threading.Thread(target=second_thread, daemon=True).start()
  if call == "pure_callback":
    f = jax.jit(lambda v: jax.pure_callback(
        host, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
  else:
    jax.config.update("jax_host_callback_transport", call)
    f = jax.jit(lambda v: hcb.call(host, v, result_shape=v))
  start = time.perf_counter()
  ok = np.asarray(f(x))[0] == 0
  return (f"{jax.default_backend()}: during a {call} call, a second thread "
          f"that does {work}: {'ok' if ok else 'BLOCKED'} "
          f"({time.perf_counter() - start:.2f} s)")


def main() -> None:
  global WAIT_SECONDS  # pylint: disable=global-statement
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--wait", type=float, default=WAIT_SECONDS)
  parser.add_argument("--at-a-time", type=int, default=AT_A_TIME)
  parser.add_argument("--own-only", action="store_true",
                      help="only the cases where host functions compile")
  parser.add_argument("--stacks", metavar="FOLDER",
                      help="write each hung case's whole native stacks "
                      "(gdb's output) there")
  parser.add_argument("case", nargs="*", help=argparse.SUPPRESS)
  args = parser.parse_args()
  WAIT_SECONDS = args.wait
  if len(args.case) == 2:
    run = own_case if args.case in map(list, OWN) else one_case
    print(run(*args.case), flush=True)
    return
  if args.stacks:
    os.makedirs(args.stacks, exist_ok=True)
  # The cases share the device: none takes most of its memory up front.
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  cases = ([] if args.own_only else list(itertools.product(CALLS, WORK))
           ) + list(OWN)
  for start in range(0, len(cases), args.at_a_time):
    # One limit for the whole batch: a hung case does not add its own.
    hung_cases.run_batch({"_".join(case): [sys.executable, "-m", __spec__.name,
                                           "--wait", str(args.wait), *case]
                          for case in cases[start:start + args.at_a_time]},
                         args.wait + CASE_SLACK_SECONDS, env, args.stacks)


if __name__ == "__main__":
  main()
