"""Analysis: what a module imports, and the places that need a human."""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider

from . import barrier_errors
from .common import (_MODULE_PATH_STRING, _SETTING, ID_TAP_KEYWORDS,
                     LEGACY_MODULE, NEW_MODULE, PUBLIC_NAMES, SETTING_HINTS,
                     SETTING_HINT_DEFAULT, SUPPORTED_SETTINGS, Report,
                     dotted_name, local_name)


@dataclasses.dataclass
class Namespace:
  """What the imports of one namespace bind: of a file, or of all the cells
  of a notebook (which run in one namespace)."""
  # Expressions naming the module, and `jax.experimental`.
  module_names: set[str] = dataclasses.field(
      default_factory=lambda: {LEGACY_MODULE})
  experimental_names: set[str] = dataclasses.field(
      default_factory=lambda: {"jax.experimental"})
  # Local name -> name in the module, for `from <the module> import name`.
  imported: dict[str, str] = dataclasses.field(default_factory=dict)
  # Some import will bind the name `host_callback` to the module.
  binds_host_callback: bool = False
  # `import jax.experimental.host_callback`, which also binds `jax`.
  plain_legacy_import: bool = False
  # Another import binds `jax`.
  other_jax_import: bool = False


class Analyzer(cst.CSTVisitor):
  """Records a module's imports in a `Namespace`, and reports, with line
  numbers, what needs a human."""

  METADATA_DEPENDENCIES = (PositionProvider,)

  def __init__(self, namespace: Namespace) -> None:
    super().__init__()
    self.namespace = namespace
    self.reports: list[Report] = []
    # Lines using `jax.experimental.host_callback.`: reported unless some
    # import binds `host_callback`, which only the whole namespace tells.
    self.chain_lines: list[int] = []

  def _line(self, node: cst.CSTNode) -> int:
    return self.get_metadata(PositionProvider, node).start.line

  def _report(self, node: cst.CSTNode, message: str) -> None:
    self.reports.append(Report(self._line(node), message))

  def _check_name(self, node: cst.CSTNode, name: str, shown: str) -> None:
    """Reports `name`, used as `shown`, unless the package provides it."""
    if name in PUBLIC_NAMES or (name.startswith("__") and name.endswith("__")):
      return
    if name.startswith("_"):
      self._report(node, f"`{shown}` is private to the old module and "
                   "host_callback has no equivalent; rewrite this by hand")
    else:
      self._report(node, f"`{shown}` is not provided by host_callback (it "
                   f"has {', '.join(sorted(PUBLIC_NAMES))})")

  def _bind(self, module: Optional[str], local: Optional[str]) -> None:
    """Records that an import binds `local` to `module`."""
    if module in (LEGACY_MODULE, NEW_MODULE):
      self.namespace.module_names.add(local)
      self.namespace.binds_host_callback |= local == NEW_MODULE
    elif module == "jax.experimental":
      self.namespace.experimental_names.add(local)

  def visit_Import(self, node: cst.Import) -> bool:
    for alias in node.names:
      dotted, local = dotted_name(alias.name), local_name(alias)
      if alias.asname is not None:
        self._bind(dotted, local)
      elif dotted in (LEGACY_MODULE, NEW_MODULE):
        self._bind(dotted, NEW_MODULE)  # what it binds once rewritten
        self.namespace.plain_legacy_import |= dotted == LEGACY_MODULE
      if local == "jax" and dotted != LEGACY_MODULE:
        self.namespace.other_jax_import = True
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    module = None if node.relative else dotted_name(node.module)
    if module in (LEGACY_MODULE, NEW_MODULE):
      self._import_names(node)
    elif module is not None and not isinstance(node.names, cst.ImportStar):
      for alias in node.names:
        self._bind(f"{module}.{dotted_name(alias.name)}", local_name(alias))
    return False

  def _import_names(self, node: cst.ImportFrom) -> None:
    """Records (and checks) the names of `from <the module> import ...`."""
    if isinstance(node.names, cst.ImportStar):
      self.namespace.imported.update((name, name) for name in PUBLIC_NAMES)
      return
    for alias in node.names:
      name = dotted_name(alias.name)
      self.namespace.imported[local_name(alias)] = name
      self._check_name(alias, name, name)

  def visit_Attribute(self, node: cst.Attribute) -> None:
    base, name = dotted_name(node.value), node.attr.value
    if base is None:
      return
    if f"{base}.{name}" == LEGACY_MODULE:
      self.chain_lines.append(self._line(node))
    elif base in self.namespace.experimental_names and name == "host_callback":
      self._report(node, f"`{base}.host_callback`: import host_callback and "
                   "use it instead (rewrite this by hand)")
    elif base in self.namespace.module_names:
      self._check_name(node, name, f"{base}.{name}")

  def visit_Call(self, node: cst.Call) -> None:
    if self._callee(node.func) == "id_tap":
      self._check_id_tap(node)

  def _callee(self, func: cst.BaseExpression) -> Optional[str]:
    """The module's function that `func` names, if it names one."""
    if isinstance(func, cst.Name):
      return self.namespace.imported.get(func.value)
    if isinstance(func, cst.Attribute) and dotted_name(
        func.value) in self.namespace.module_names:
      return func.attr.value
    return None

  def _check_id_tap(self, node: cst.Call) -> None:
    extra = [arg.keyword.value for arg in node.args
             if arg.keyword is not None and arg.keyword.value not in
             ID_TAP_KEYWORDS | {"callback_flavor"}]
    if extra:
      shown = ", ".join(f"{name}=" for name in extra)
      self._report(node, f"id_tap no longer passes keyword arguments ({shown}) "
                   "to the tap function and raises TypeError; pre-apply them "
                   "with functools.partial or a closure")
    if any(arg.star == "**" for arg in node.args):
      self._report(node, "id_tap(..., **kwargs): check that only result=, "
                   "tap_with_device= and device_index= are passed")

  def visit_SimpleString(self, node: cst.SimpleString) -> None:
    value = node.evaluated_value
    if isinstance(value, str) and _MODULE_PATH_STRING.fullmatch(value):
      self._report(node, f"the string {value!r} names the old module (for "
                   "mock.patch?); change it to host_callback by hand")


def uses_name(wrapper: MetadataWrapper, name: str) -> bool:
  """Whether any scope of the module reads `name`."""
  scopes = {scope for scope in wrapper.resolve(ScopeProvider).values()
            if scope is not None}
  return any(scope.accesses[name] for scope in scopes)


def chain_reports(analyzer: Analyzer, binds_host_callback: bool
                   ) -> list[Report]:
  """Reports the uses of `jax.experimental.host_callback.` left as they are
  because nothing binds `host_callback` to rewrite them to."""
  if binds_host_callback:
    return []
  return [Report(line, f"`{LEGACY_MODULE}` is used here but not imported as "
                 "such; import host_callback and use it instead")
          for line in analyzer.chain_lines]


def barrier_reports(code: str) -> list[Report]:
  """Reports each `barrier_wait()` in a `try` that catches
  `CallbackException`: code that expects the outfeed mode."""
  return [Report(line, barrier_errors.message(caught))
          for line, caught in barrier_errors.barrier_catches(code)]


def setting_reports(code: str) -> list[Report]:
  """Reports each unsupported `jax_host_callback_*` setting named in `code`,
  in strings, flags, environment variables or magics alike."""
  reports = []
  for number, line in enumerate(code.splitlines(), 1):
    for match in _SETTING.finditer(line):
      name = match.group().lower()
      if name not in SUPPORTED_SETTINGS:
        hint = SETTING_HINTS.get(name, SETTING_HINT_DEFAULT)
        reports.append(Report(number, f"setting `{match.group()}` is not "
                              f"supported: {hint}"))
  return reports
