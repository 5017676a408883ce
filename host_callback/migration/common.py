"""What the codemod's parts share: the old and new module, the names and
settings the package has, and the results (`Report`, `Migration`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import libcst as cst

LEGACY_MODULE = "jax.experimental.host_callback"
NEW_MODULE = "host_callback"
# What the package provides (`host_callback.__all__`, listed here so that the
# codemod does not import the package's runtime; a test keeps them equal);
# other names used from the module are reported.
PUBLIC_NAMES = frozenset({
    "CallError", "CallbackException", "CallbackFlavor", "Shard",
    "TapFunctionException",
    "barrier_wait", "call",
    "id_print", "id_tap", "install", "queue_statistics",
    "stop_outfeed_receiver",
})
ID_TAP_KEYWORDS = frozenset({"result", "tap_with_device", "device_index"})
# The options host_callback's settings module registers (listed here so that
# the codemod does not import JAX; a test keeps them equal).
SUPPORTED_SETTINGS = frozenset({
    "jax_host_callback_inline", "jax_host_callback_max_queue_byte_size",
    "jax_host_callback_outfeed", "jax_host_callback_record_lens",
    "jax_host_callback_transport",
})
SETTING_HINTS = {
    "jax_host_callback_legacy":
        "host_callback always behaves as the legacy implementation; remove it",
    "jax_host_callback_ad_transforms":
        "under jvp/grad host_callback taps primal values only and adds no "
        "'jvp'/'transpose' entries to `transforms`; remove it",
}
SETTING_HINT_DEFAULT = (
    f"host_callback only has {', '.join(sorted(SUPPORTED_SETTINGS))}; "
    "remove it")

_SETTING = re.compile(r"\bjax_host_callback_\w+", re.IGNORECASE)
_MODULE_PATH_STRING = re.compile(r"jax\.experimental\.host_callback(\.\w+)*")


@dataclasses.dataclass(frozen=True)
class Report:
  """A place that needs a human: 1-based `line` and what to do there."""
  line: int
  message: str


@dataclasses.dataclass(frozen=True)
class Migration:
  """Migrated source text and the reports about it."""
  code: str
  reports: tuple[Report, ...]


class MigrationError(Exception):
  """A file that could not be read or parsed."""


def dotted_name(node: cst.CSTNode) -> Optional[str]:
  """`a.b.c` for a Name/Attribute chain, None for any other expression."""
  if isinstance(node, cst.Name):
    return node.value
  if isinstance(node, cst.Attribute):
    base = dotted_name(node.value)
    return None if base is None else f"{base}.{node.attr.value}"
  return None


def local_name(alias: cst.ImportAlias) -> Optional[str]:
  """The name an import alias binds (`a` for `import a.b`)."""
  if alias.asname is not None:
    return dotted_name(alias.asname.name)
  dotted = dotted_name(alias.name)
  return None if dotted is None else dotted.partition(".")[0]
