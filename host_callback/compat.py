"""Opt-in alias: old `jax.experimental.host_callback` imports get this package.

    import host_callback
    host_callback.install()

    from jax.experimental import host_callback as hcb   # now host_callback
    import jax.experimental.host_callback as hcb        # same module
    from jax.experimental.host_callback import id_tap   # host_callback.id_tap

Current JAX has no `jax.experimental.host_callback` (importing it raises
ModuleNotFoundError), so nothing of JAX's is replaced: `install()` only adds
the missing name. Until it is called, JAX is left untouched.
"""

from __future__ import annotations

import sys
import types

import jax.experimental

LEGACY_NAME = "jax.experimental.host_callback"


def _package() -> types.ModuleType:
  """The `host_callback` package (imported here, not at module import time,
  because the package's `__init__` imports this module)."""
  import host_callback  # pylint: disable=import-outside-toplevel
  return host_callback


def install() -> types.ModuleType:
  """Makes `jax.experimental.host_callback` name this package.

  Afterwards `from jax.experimental import host_callback`, `import
  jax.experimental.host_callback` and `from jax.experimental.host_callback
  import id_tap, call, ...` all give the `host_callback` module itself. Call it
  once, before the old imports run; calling it again does nothing more.

  Returns:
    The `host_callback` module.
  """
  package = _package()
  # The import system looks in sys.modules first, so this wins over any
  # module JAX might ship under that name (current JAX ships none).
  sys.modules[LEGACY_NAME] = package
  # `from jax.experimental import host_callback` reads the attribute first.
  jax.experimental.host_callback = package
  return package

