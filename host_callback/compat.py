"""Opt-in alias: old `jax.experimental.host_callback` imports get this package.

    import host_callback
    host_callback.install()

    from jax.experimental import host_callback as hcb   # now host_callback
    import jax.experimental.host_callback as hcb        # same module
    from jax.experimental.host_callback import id_tap   # host_callback.id_tap

Current JAX has no `jax.experimental.host_callback` (importing it raises
ModuleNotFoundError), so nothing of JAX's is replaced: `install()` only adds
the missing name. Until it is called, JAX is left untouched.

In the synchronous mode (the CPU default) `install()` also warns about
code in the calling file and the main script that catches
`CallbackException` around `barrier_wait()`: it expects the outfeed mode.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Iterable

import jax.experimental

from . import settings
from .migration import barrier_errors

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
  Unless the outfeed mode is set, it warns (`UserWarning`) about each
  `barrier_wait()` in a `try` that catches `CallbackException` in the
  calling file and the main script.

  Returns:
    The `host_callback` module.
  """
  package = _package()
  # The import system looks in sys.modules first, so this wins over any
  # module JAX might ship under that name (current JAX ships none).
  sys.modules[LEGACY_NAME] = package
  # `from jax.experimental import host_callback` reads the attribute first.
  jax.experimental.host_callback = package
  if not settings.outfeed.value:
    _warn_about_barrier_catches({sys._getframe(1).f_code.co_filename,  # pylint: disable=protected-access
                                 getattr(sys.modules["__main__"], "__file__",
                                         None)})
  return package


def _warn_about_barrier_catches(paths: Iterable[object]) -> None:
  """Warns about code in the files `paths` that expects tap errors at
  `barrier_wait()` (paths that are not files are skipped)."""
  for path in sorted(p for p in paths if isinstance(p, str)):
    try:
      with open(path, encoding="utf-8") as file:
        source = file.read()
    except (OSError, UnicodeDecodeError):
      continue  # <stdin>, a notebook cell, ...
    for line, caught in barrier_errors.barrier_catches(source):
      warnings.warn(f"{path}:{line}: {barrier_errors.message(caught)}",
                    stacklevel=3)

