"""Checks an installation: a tap and a call on the native transport, in the
synchronous mode and in the outfeed mode, each in a fresh interpreter.

    python -m host_callback.smoke

The children never import a checkout's `host_callback` (`python -P`):
they check the installed package, e.g. a wheel (CI's wheel check in
`.ci/run`). Prints one line per mode and exits non-zero if anything differs
from what is expected (the native module missing, the Python transport
chosen, a wrong value). This module imports only the standard library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_CHECK = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import host_callback as hcb
    from host_callback.host import transport_policy
    from host_callback.receiver import native_library

    assert native_library.available(), "the native module is not installed"
    assert transport_policy.for_platform("cpu") == "native"
    seen = []

    @jax.jit
    def step(x):
      x = hcb.id_tap(lambda v, transforms: seen.append(v.tolist()), x)
      return hcb.call(lambda v: v * 10, x, result_shape=x)

    out = step(jnp.arange(3.0))
    hcb.barrier_wait()
    assert out.tolist() == [0.0, 10.0, 20.0], out
    assert seen == [[0.0, 1.0, 2.0]], seen
    print(f"ok: jax {jax.__version__}, native module "
          f"{native_library.native.__file__}")
    """)


def check(outfeed: bool) -> bool:
  """Runs the check in a child in the given mode; whether it passed."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_HOST_CALLBACK_TRANSPORT="native",
             JAX_HOST_CALLBACK_OUTFEED="1" if outfeed else "0")
  done = subprocess.run([sys.executable, "-P", "-c", _CHECK], env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  mode = "outfeed" if outfeed else "synchronous"
  print(f"{mode} mode: {done.stdout.strip() or 'FAILED'}")
  if done.returncode != 0:
    print(done.stderr, file=sys.stderr)
  return done.returncode == 0


def main() -> None:
  results = [check(outfeed) for outfeed in (False, True)]
  sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
  main()
