"""host_callback: `jax.experimental.host_callback` for current JAX.

    import host_callback as hcb
    hcb.id_print(x, what="x")        # inside jit, grad, vmap, scan, ...
    hcb.barrier_wait()

The package's parts, by job: `api` (the public functions), `primitive/`
(the primitive, its rules, the ordering token and the lowerings), `host/`
(the JAX side of the receiver: host functions, the runtime, the transport
policy, `id_print`'s printing), `barrier/` (`barrier_wait`), `bars/` (the
progress bars, public as `host_callback.tqdm`), `migration/` (the codemod,
public as `host_callback.migrate`), `smoke` (`python -m
host_callback.smoke` checks an installation), and `receiver` (the host
runtime, `receiver/` in the repository).

The public names load lazily (PEP 562): the runtime and the receiver are
imported on first use of a name, so that `python -m host_callback.migrate`,
which needs neither, does not start them. `import host_callback` registers
the `jax_host_callback_*` settings, so `jax.config.update` and absl flags can
set them right after it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

try:  # one source: the version in setup.cfg, as installed
  __version__ = importlib.metadata.version("host-callback")
except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path
  __version__ = "unknown"

__all__ = [
    "CallError", "CallbackException", "CallbackFlavor", "Shard",
    "TapFunctionException", "barrier_wait", "call",
    "id_print", "id_tap", "install", "queue_statistics",
    "stop_outfeed_receiver",
]

# Public name -> (submodule, attribute) that provides it.
_LAZY = {
    "CallError": ("host.host_functions", "CallError"),
    "CallbackException": ("receiver", "CallbackException"),
    "CallbackFlavor": ("api", "CallbackFlavor"),
    "Shard": ("host.host_functions", "Shard"),
    "TapFunctionException": ("receiver", "CallbackException"),
    "barrier_wait": ("api", "barrier_wait"),
    "call": ("api", "call"),
    "id_print": ("api", "id_print"),
    "id_tap": ("api", "id_tap"),
    "install": ("compat", "install"),
    "queue_statistics": ("api", "queue_statistics"),
    "stop_outfeed_receiver": ("api", "stop_outfeed_receiver"),
}

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ loads them
  from .api import (CallbackFlavor, barrier_wait, call, id_print, id_tap,
                    queue_statistics, stop_outfeed_receiver)
  from .compat import install
  from .host.host_functions import CallError, Shard
  from .receiver import CallbackException
  TapFunctionException = CallbackException


def __getattr__(name: str) -> Any:
  try:
    module, attribute = _LAZY[name]
  except KeyError:
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r}") from None
  value = getattr(importlib.import_module(f".{module}", __name__), attribute)
  globals()[name] = value  # later lookups skip __getattr__
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))


from . import settings  # noqa: E402,F401 (registers the jax_host_callback_* options)
