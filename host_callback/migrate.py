"""Codemod: moves code from `jax.experimental.host_callback` to `host_callback`.

    python -m host_callback.migrate [--check] PATH...

PATH is a file or a directory (searched for *.py and *.ipynb, skipping hidden
directories, `__pycache__`, `site-packages`, `node_modules` and virtualenvs).
It rewrites, keeping formatting and comments:

    from jax.experimental import host_callback as hcb
    import jax.experimental.host_callback as hcb
        -> import host_callback as hcb              (any alias kept)
    import jax.experimental.host_callback
        -> import host_callback, with `jax.experimental.host_callback.id_tap`
           -> `host_callback.id_tap`, and `import jax` added when the file
           read the `jax` this import bound
    from jax.experimental.host_callback import id_tap, call
        -> from host_callback import id_tap, call

in .py files and in the code cells of Jupyter notebooks (taken as one
namespace, in order; the rest of the notebook JSON is kept as it is). On
stderr it prints `file:line: message` for what needs a human: keyword
arguments that `id_tap` no longer forwards, names the
package does not provide (private `hcb._...` ones included), strings naming
the old module, `jax_host_callback_*` settings it does not support, and
notebook lines that are not Python (IPython magics, shell escapes), which are
left unchanged. For notebooks, `line` is a line of the JSON text and the
message starts with the cell's number and the line within the cell.

With `--check` nothing is written: a unified diff goes to stdout and the exit
status is 1 if anything would change, 0 otherwise. Without it files are
rewritten in place (exit status 0). Exit status 2 means some file could not
be read or parsed (the others are still done). Needs libcst, the package's
`migrate` extra: `pip install ".[migrate]"` in a checkout, or
`pip install libcst`. It imports neither JAX nor the host_callback runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

MISSING_LIBCST = ('host_callback.migrate needs libcst, the migrate extra; '
                  'install it with: pip install libcst (or, in a '
                  'host-callback checkout: pip install ".[migrate]")')

try:
  import libcst as cst
  from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider
except ModuleNotFoundError as import_error:  # the optional `migrate` extra
  if (import_error.name or "").partition(".")[0] != "libcst":
    raise
  if __name__ == "__main__":
    print(MISSING_LIBCST, file=sys.stderr)
    sys.exit(2)
  raise ModuleNotFoundError(MISSING_LIBCST, name="libcst") from import_error

LEGACY_MODULE = "jax.experimental.host_callback"
NEW_MODULE = "host_callback"
# What the package provides (`host_callback.__all__`, listed here so that the
# codemod does not import the package's runtime; a test keeps them equal);
# other names used from the module are reported.
PUBLIC_NAMES = frozenset({
    "CallbackException", "CallbackFlavor", "TapFunctionException",
    "barrier_wait", "call",
    "id_print", "id_tap", "install", "queue_statistics",
    "stop_outfeed_receiver",
})
ID_TAP_KEYWORDS = frozenset({"result", "tap_with_device", "device_index"})
# The options host_callback's settings module registers (listed here so that
# the codemod does not import JAX; a test keeps them equal).
SUPPORTED_SETTINGS = frozenset({
    "jax_host_callback_inline", "jax_host_callback_max_queue_byte_size",
    "jax_host_callback_outfeed", "jax_host_callback_transport",
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
_CELL_MAGIC = re.compile(r"%%(\w+)")
# IPython-only lines: `%magic`, `%%cell_magic`, `!shell`, `?obj`, `obj?`,
# `obj??`, `x = !shell`, `x = %magic`.
_IPYTHON_LINE = re.compile(
    r"\s*([%!?]|[\w.]+\?\??\s*$|[\w.,\[\]() ]+=\s*[%!])")
_MASK = "pass  # host_callback.migrate: masked line {}"
_MASKED = re.compile(r"[ \t]*pass  # host_callback\.migrate: masked line (\d+)")
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})


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


def _dotted(node: cst.CSTNode) -> Optional[str]:
  """`a.b.c` for a Name/Attribute chain, None for any other expression."""
  if isinstance(node, cst.Name):
    return node.value
  if isinstance(node, cst.Attribute):
    base = _dotted(node.value)
    return None if base is None else f"{base}.{node.attr.value}"
  return None


def _local_name(alias: cst.ImportAlias) -> Optional[str]:
  """The name an import alias binds (`a` for `import a.b`)."""
  if alias.asname is not None:
    return _dotted(alias.asname.name)
  dotted = _dotted(alias.name)
  return None if dotted is None else dotted.partition(".")[0]


# --- Analysis: what the file imports, and what needs a human -------------


@dataclasses.dataclass
class _Namespace:
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


class _Analyzer(cst.CSTVisitor):
  """Records a module's imports in a `_Namespace`, and reports, with line
  numbers, what needs a human."""

  METADATA_DEPENDENCIES = (PositionProvider,)

  def __init__(self, namespace: _Namespace) -> None:
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
      dotted, local = _dotted(alias.name), _local_name(alias)
      if alias.asname is not None:
        self._bind(dotted, local)
      elif dotted in (LEGACY_MODULE, NEW_MODULE):
        self._bind(dotted, NEW_MODULE)  # what it binds once rewritten
        self.namespace.plain_legacy_import |= dotted == LEGACY_MODULE
      if local == "jax" and dotted != LEGACY_MODULE:
        self.namespace.other_jax_import = True
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    module = None if node.relative else _dotted(node.module)
    if module in (LEGACY_MODULE, NEW_MODULE):
      self._import_names(node)
    elif module is not None and not isinstance(node.names, cst.ImportStar):
      for alias in node.names:
        self._bind(f"{module}.{_dotted(alias.name)}", _local_name(alias))
    return False

  def _import_names(self, node: cst.ImportFrom) -> None:
    """Records (and checks) the names of `from <the module> import ...`."""
    if isinstance(node.names, cst.ImportStar):
      self.namespace.imported.update((name, name) for name in PUBLIC_NAMES)
      return
    for alias in node.names:
      name = _dotted(alias.name)
      self.namespace.imported[_local_name(alias)] = name
      self._check_name(alias, name, name)

  def visit_Attribute(self, node: cst.Attribute) -> None:
    base, name = _dotted(node.value), node.attr.value
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
    if isinstance(func, cst.Attribute) and _dotted(
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


def _uses_name(wrapper: MetadataWrapper, name: str) -> bool:
  """Whether any scope of the module reads `name`."""
  scopes = {scope for scope in wrapper.resolve(ScopeProvider).values()
            if scope is not None}
  return any(scope.accesses[name] for scope in scopes)


# --- Rewriting -------------------------------------------------------------


def _new_import(aliases: Sequence[cst.ImportAlias]) -> cst.Import:
  """`import host_callback [as x], ...` keeping each alias's `as` part."""
  return cst.Import(names=[
      alias.with_changes(name=cst.Name(NEW_MODULE),
                         comma=cst.MaybeSentinel.DEFAULT)
      for alias in aliases])


def _last_comma(kept: Union[cst.Comma, cst.MaybeSentinel],
                last: Union[cst.Comma, cst.MaybeSentinel], parenthesized: bool
                ) -> Union[cst.Comma, cst.MaybeSentinel]:
  """The comma after the name that becomes last in an import list: none
  unless the list had a trailing comma in parentheses; then `kept`'s, with
  its comment but the line break that `last`'s comma had before `)`."""
  if not (parenthesized and isinstance(last, cst.Comma)
          and isinstance(kept, cst.Comma)):
    return cst.MaybeSentinel.DEFAULT
  before, after = kept.whitespace_after, last.whitespace_after
  if isinstance(before, cst.ParenthesizedWhitespace) and isinstance(
      after, cst.ParenthesizedWhitespace):
    after = before.with_changes(indent=after.indent, last_line=after.last_line)
  return kept.with_changes(whitespace_after=after)


class _Rewriter(cst.CSTTransformer):
  """Rewrites the imports, and `jax.experimental.host_callback.x` chains
  when the file binds `host_callback`."""

  def __init__(self, rewrite_chains: bool, add_jax_import: bool) -> None:
    super().__init__()
    self._rewrite_chains = rewrite_chains
    self._add_jax_import = add_jax_import

  def visit_Import(self, node: cst.Import) -> bool:
    return False  # rewritten whole in _rewrite

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    return False

  def leave_Attribute(self, original_node: cst.Attribute,
                      updated_node: cst.Attribute) -> cst.BaseExpression:
    if self._rewrite_chains and _dotted(updated_node) == LEGACY_MODULE:
      return cst.Name(NEW_MODULE, lpar=updated_node.lpar,
                      rpar=updated_node.rpar)
    return updated_node

  def leave_SimpleStatementLine(
      self, original_node: cst.SimpleStatementLine,
      updated_node: cst.SimpleStatementLine
  ) -> Union[cst.SimpleStatementLine,
             cst.FlattenSentinel[cst.SimpleStatementLine]]:
    body = [new for old in updated_node.body for new in self._rewrite(old)]
    if len(body) == len(updated_node.body) or len(updated_node.body) > 1:
      return updated_node.with_changes(body=body)
    # One statement became several: one line each, comments kept around them.
    lines = [cst.SimpleStatementLine(body=[statement]) for statement in body]
    lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
    lines[-1] = lines[-1].with_changes(
        trailing_whitespace=updated_node.trailing_whitespace)
    return cst.FlattenSentinel(lines)

  def leave_SimpleStatementSuite(
      self, original_node: cst.SimpleStatementSuite,
      updated_node: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
    return updated_node.with_changes(
        body=[new for old in updated_node.body for new in self._rewrite(old)])

  def _rewrite(self, statement: cst.BaseSmallStatement
               ) -> list[cst.BaseSmallStatement]:
    if isinstance(statement, cst.Import):
      return self._rewrite_import(statement)
    if isinstance(statement, cst.ImportFrom):
      return self._rewrite_import_from(statement)
    return [statement]

  def _rewrite_import(self, statement: cst.Import) -> list[cst.Import]:
    aliases, binds_jax = [], False
    for alias in statement.names:
      if _dotted(alias.name) == LEGACY_MODULE:
        binds_jax |= alias.asname is None
        alias = alias.with_changes(name=cst.Name(NEW_MODULE))
      aliases.append(alias)
    rewritten = statement.with_changes(names=aliases)
    if binds_jax and self._add_jax_import:
      return [cst.Import(names=[cst.ImportAlias(cst.Name("jax"))]), rewritten]
    return [rewritten]

  def _rewrite_import_from(self, statement: cst.ImportFrom
                           ) -> list[cst.BaseSmallStatement]:
    module = None if statement.relative else _dotted(statement.module)
    if module == LEGACY_MODULE:
      return [statement.with_changes(module=cst.Name(NEW_MODULE))]
    if module != "jax.experimental" or isinstance(statement.names,
                                                  cst.ImportStar):
      return [statement]
    ours = [alias for alias in statement.names
            if _dotted(alias.name) == "host_callback"]
    rest = [alias for alias in statement.names
            if _dotted(alias.name) != "host_callback"]
    if not ours:
      return [statement]
    new_import = _new_import(ours).with_changes(semicolon=statement.semicolon)
    if not rest:
      return [new_import]
    rest[-1] = rest[-1].with_changes(
        comma=_last_comma(rest[-1].comma, statement.names[-1].comma,
                          parenthesized=statement.lpar is not None))
    return [statement.with_changes(names=rest,
                                   semicolon=cst.MaybeSentinel.DEFAULT),
            new_import]


# --- Sources: Python text, notebook cells, notebooks ----------------------


def _migrate_modules(codes: Sequence[str]) -> list[Migration]:
  """Migrates modules that share one namespace, in the order they run (one
  file, or the cells of a notebook); raises cst.ParserSyntaxError.

  Settings are not reported here (see `_setting_reports`).
  """
  wrappers = [MetadataWrapper(cst.parse_module(code)) for code in codes]
  namespace = _Namespace()
  analyzers = [_Analyzer(namespace) for _ in wrappers]
  for wrapper, analyzer in zip(wrappers, analyzers):
    wrapper.visit(analyzer)
  add_jax_import = (namespace.plain_legacy_import
                    and not namespace.other_jax_import
                    and any(_uses_name(wrapper, "jax") for wrapper in wrappers))
  rewriter = _Rewriter(namespace.binds_host_callback, add_jax_import)
  return [Migration(wrapper.module.visit(rewriter).code,
                    _sorted([*analyzer.reports, *_chain_reports(
                        analyzer, namespace.binds_host_callback)]))
          for wrapper, analyzer in zip(wrappers, analyzers)]


def _chain_reports(analyzer: _Analyzer, binds_host_callback: bool
                   ) -> list[Report]:
  """Reports the uses of `jax.experimental.host_callback.` left as they are
  because nothing binds `host_callback` to rewrite them to."""
  if binds_host_callback:
    return []
  return [Report(line, f"`{LEGACY_MODULE}` is used here but not imported as "
                 "such; import host_callback and use it instead")
          for line in analyzer.chain_lines]


def _setting_reports(code: str) -> list[Report]:
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


def _sorted(reports: Iterable[Report]) -> tuple[Report, ...]:
  return tuple(sorted(reports, key=lambda report: report.line))


def migrate_source(code: str) -> Migration:
  """Migrates the text of a Python file; raises cst.ParserSyntaxError."""
  [migration] = _migrate_modules([code])
  return Migration(migration.code,
                   _sorted([*migration.reports, *_setting_reports(code)]))


def _masked(lines: Sequence[str], masked: set[int]) -> str:
  """`lines` with each masked line replaced by an indented marker `pass`."""
  out = []
  for index, line in enumerate(lines):
    if index in masked:
      body = line.rstrip("\r\n")
      indent = body[:len(body) - len(body.lstrip())]
      line = indent + _MASK.format(index) + line[len(body):]
    out.append(line)
  return "".join(out)


def _unmasked(code: str, lines: Sequence[str]) -> str:
  """Puts the original lines back in place of the markers."""
  out = []
  for line in code.splitlines(keepends=True):
    marker = _MASKED.fullmatch(line.rstrip("\r\n"))
    out.append(lines[int(marker.group(1))] if marker else line)
  return "".join(out)


def _parses(code: str) -> bool:
  try:
    cst.parse_module(code)
  except cst.ParserSyntaxError:
    return False
  return True


def _as_python(source: str) -> tuple[Optional[str], set[int]]:
  """A code cell as Python: as it is if it parses, else with its IPython
  lines (magics, shell escapes, `obj?` help) masked; and the indices of the
  masked lines. None instead of the code if it does not parse even then."""
  if _parses(source):
    return source, set()
  lines = source.splitlines(keepends=True)
  masked = {index for index, line in enumerate(lines)
            if _IPYTHON_LINE.match(line)}
  code = _masked(lines, masked)
  return (code if _parses(code) else None), masked


def _cell_migration(source: str, masked: set[int],
                    migration: Optional[Migration]) -> Migration:
  """The migration of a cell from that of its Python (None if it had none):
  IPython lines put back and reported, settings reported."""
  settings = _setting_reports(source)
  if migration is None:
    magic = _CELL_MAGIC.match(source)
    what = (f"cell magic `%%{magic.group(1)}` whose body is not Python"
            if magic else "cannot parse this cell")
    return Migration(source, _sorted([Report(1, f"{what}: cell left "
                                             "unchanged"), *settings]))
  ipython = [Report(index + 1, "IPython syntax (magic, shell escape or help) "
                    "left unchanged: check it by hand") for index in masked]
  code = _unmasked(migration.code, source.splitlines(keepends=True))
  return Migration(code, _sorted([*ipython, *migration.reports, *settings]))


def migrate_cells(sources: Sequence[str]) -> list[Migration]:
  """Migrates the code cells of a notebook, in order.

  A cell that does not parse has its IPython lines set aside, left unchanged
  and reported; if it still does not parse, it is left unchanged and reported.
  """
  prepared = [_as_python(source) for source in sources]
  migrations = iter(_migrate_modules(
      [code for code, _ in prepared if code is not None]))
  return [_cell_migration(source, masked,
                          None if code is None else next(migrations))
          for source, (code, masked) in zip(sources, prepared)]


def _source_lines(text: str) -> list[tuple[int, bool]]:
  """For each `"source":` key of a notebook's JSON text: its line number, and
  whether its list of lines follows one per line (as nbformat writes it)."""
  return [(number, line.rstrip().endswith("["))
          for number, line in enumerate(text.splitlines(), 1)
          if line.lstrip().startswith('"source":')]


def _dumps_like(notebook: dict, original: str) -> str:
  """`notebook` as JSON laid out like `original` (nbformat writes indent=1,
  non-ASCII characters unescaped, a final newline)."""
  lines = original.splitlines()
  indent = None
  if len(lines) > 1:
    indent = lines[1][:len(lines[1]) - len(lines[1].lstrip())] or None
  text = json.dumps(notebook, indent=indent, ensure_ascii=original.isascii())
  return text + "\n" if original.endswith("\n") else text


def migrate_notebook(text: str) -> Migration:
  """Migrates the code cells of a notebook's JSON text; raises ValueError.

  Report lines are lines of the JSON text (the `"source"` key's when the
  cell's own line cannot be located); messages start with the cell's number
  and the line within the cell.
  """
  notebook = json.loads(text)
  if not isinstance(notebook, dict):
    raise ValueError("the JSON text is not an object")
  cells = notebook.get("cells", [])
  source_lines = _source_lines(text)
  if len(source_lines) != len(cells):
    source_lines = [(1, False)] * len(cells)
  code_cells = [index for index, cell in enumerate(cells)
                if cell.get("cell_type") == "code"]
  sources = [_joined(cells[index].get("source", "")) for index in code_cells]
  reports, changed = [], False
  for index, source, migration in zip(code_cells, sources,
                                      migrate_cells(sources)):
    as_list = isinstance(cells[index].get("source"), list)
    if migration.code != source:
      changed = True
      cells[index]["source"] = (migration.code.splitlines(keepends=True)
                                if as_list else migration.code)
    key_line, one_per_line = source_lines[index]
    for report in migration.reports:
      line = key_line + report.line if one_per_line and as_list else key_line
      reports.append(Report(line, f"cell {index + 1}, line {report.line}: "
                            f"{report.message}"))
  return Migration(_dumps_like(notebook, text) if changed else text,
                   _sorted(reports))


def _joined(source: Union[str, list[str]]) -> str:
  """A cell's source (a string, or a list of lines) as one string."""
  return source if isinstance(source, str) else "".join(source)


# --- Files and the command line ------------------------------------------


def _searched(directory: Path, name: str) -> bool:
  """Whether to look inside the subdirectory `name` of `directory`."""
  return not (name.startswith(".") or name in _SKIPPED_DIRS
              or (directory / name / "pyvenv.cfg").exists())


def iter_sources(paths: Iterable[Path]) -> Iterator[Path]:
  """The files to migrate: each file of `paths`, and the *.py and *.ipynb
  files under each directory of `paths`, in a stable order."""
  for path in paths:
    if not path.is_dir():
      yield path
      continue
    for root, dirs, files in os.walk(path):
      dirs[:] = sorted(name for name in dirs if _searched(Path(root), name))
      yield from (Path(root) / name for name in sorted(files)
                  if name.endswith((".py", ".ipynb")))


def migrate_text(path: Path, text: str) -> Migration:
  """Migrates `text`, the contents of `path` (a notebook if it ends .ipynb);
  raises MigrationError."""
  try:
    if path.suffix != ".ipynb":
      return migrate_source(text)
    try:
      return migrate_notebook(text)
    except ValueError as error:  # json.JSONDecodeError included
      raise MigrationError(f"{path}: error: not a notebook: {error}"
                           ) from error
  except cst.ParserSyntaxError as error:
    raise MigrationError(f"{path}: error: cannot parse ({error.message})"
                         ) from error


def _read(path: Path) -> str:
  try:
    with open(path, encoding="utf-8", newline="") as file:
      return file.read()
  except (OSError, UnicodeDecodeError) as error:
    raise MigrationError(f"{path}: error: {error}") from error


def _diff(path: Path, old: str, new: str) -> Iterator[str]:
  return difflib.unified_diff(old.splitlines(keepends=True),
                              new.splitlines(keepends=True),
                              fromfile=f"a/{path}", tofile=f"b/{path}")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m host_callback.migrate",
      description="Moves code from jax.experimental.host_callback to the "
      "host_callback package, and reports what needs a human.")
  parser.add_argument("paths", metavar="PATH", nargs="+", type=Path,
                      help="a .py or .ipynb file, or a directory to search")
  parser.add_argument("--check", action="store_true",
                      help="write nothing; print a diff and exit 1 if "
                      "anything would change")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line; returns the exit status (0 nothing to change or
  all rewritten, 1 changes needed under --check, 2 a file had an error)."""
  args = _parser().parse_args(argv)
  changed, reported, failed = 0, 0, False
  for path in iter_sources(args.paths):
    try:
      old = _read(path)
      migration = migrate_text(path, old)
    except MigrationError as error:
      print(error, file=sys.stderr)
      failed = True
      continue
    for report in migration.reports:
      print(f"{path}:{report.line}: {report.message}", file=sys.stderr)
    reported += len(migration.reports)
    if migration.code == old:
      continue
    changed += 1
    if args.check:
      sys.stdout.writelines(_diff(path, old, migration.code))
    else:
      with open(path, "w", encoding="utf-8", newline="") as file:
        file.write(migration.code)
      print(f"rewrote {path}")
  verb = "would be rewritten" if args.check else "rewritten"
  print(f"{changed} file(s) {verb}, {reported} place(s) to check by hand",
        file=sys.stderr)
  if failed:
    return 2
  return 1 if args.check and changed else 0


if __name__ == "__main__":
  sys.exit(main())
