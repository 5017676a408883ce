"""While a host function blocks a computation's launch, can another thread
use JAX on the same device? Prints one line per case, on the default
backend (a GPU's answer is the one of interest):

    python -m tools.gpu_compile_during_call

Each case runs in a process of its own, four at a time: a jitted `call`
(native or python transport) or `jax.pure_callback` whose host function
waits up to WAIT_SECONDS for a second thread, which meanwhile compiles,
compiles and runs, or runs an already compiled function on the default
device, puts an array there, or runs a function on the CPU.
"ok" means the second thread finished while the host function waited;
"BLOCKED" that it did not. On an H200 with jax 0.11.2, the cases that
compile for the GPU were blocked, on every transport and with
`pure_callback` (docs/architecture.md, "The CUDA part").
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time

CALLS = ("native", "python", "pure_callback")
WORK = ("compile_run", "run", "compile", "put", "cpu")
WAIT_SECONDS = 20
AT_A_TIME = 4


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
  if len(sys.argv) == 3:
    print(one_case(*sys.argv[1:]), flush=True)
    return
  # The cases share the device: none takes most of its memory up front.
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  cases = list(itertools.product(CALLS, WORK))
  for start in range(0, len(cases), AT_A_TIME):
    running = [(case, subprocess.Popen(
        [sys.executable, "-m", __spec__.name, *case], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
               for case in cases[start:start + AT_A_TIME]]
    for case, process in running:
      try:
        out, _ = process.communicate(timeout=WAIT_SECONDS + 100)
      except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
      print(out.strip() or f"{' '.join(case)}: the case failed (exit "
            f"{process.returncode})", flush=True)


if __name__ == "__main__":
  main()
