"""Moves code from `jax.experimental.host_callback` to `host_callback`.

    python tools/migrate.py [--check] PATH...     (or: python -m tools.migrate)

The same as `python -m host_callback.migrate` (which documents the options);
needs the package installed with its `migrate` extra (libcst):
`pip install ".[migrate]"` in a checkout.
"""

import runpy

if __name__ == "__main__":
  runpy.run_module("host_callback.migrate", run_name="__main__", alter_sys=True)
