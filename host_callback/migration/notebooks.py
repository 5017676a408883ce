"""Notebooks: their code cells, migrated as one namespace, IPython lines set
aside; the JSON text kept as it is laid out."""

from __future__ import annotations

import json
import re
from typing import Optional, Sequence, Union

import libcst as cst

from .analysis import barrier_reports, setting_reports
from .common import Migration, Report
from .rewriting import migrate_modules, sorted_reports

_CELL_MAGIC = re.compile(r"%%(\w+)")
# IPython-only lines: `%magic`, `%%cell_magic`, `!shell`, `?obj`, `obj?`,
# `obj??`, `x = !shell`, `x = %magic`.
_IPYTHON_LINE = re.compile(
    r"\s*([%!?]|[\w.]+\?\??\s*$|[\w.,\[\]() ]+=\s*[%!])")
_MASK = "pass  # host_callback.migrate: masked line {}"
_MASKED = re.compile(r"[ \t]*pass  # host_callback\.migrate: masked line (\d+)")


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
  settings = setting_reports(source)
  if migration is None:
    magic = _CELL_MAGIC.match(source)
    what = (f"cell magic `%%{magic.group(1)}` whose body is not Python"
            if magic else "cannot parse this cell")
    return Migration(source, sorted_reports([Report(1, f"{what}: cell left "
                                             "unchanged"), *settings]))
  ipython = [Report(index + 1, "IPython syntax (magic, shell escape or help) "
                    "left unchanged: check it by hand") for index in masked]
  lines = source.splitlines(keepends=True)
  barriers = barrier_reports(_masked(lines, masked))
  code = _unmasked(migration.code, lines)
  return Migration(code, sorted_reports([*ipython, *migration.reports,
                                         *settings, *barriers]))


def migrate_cells(sources: Sequence[str]) -> list[Migration]:
  """Migrates the code cells of a notebook, in order.

  A cell that does not parse has its IPython lines set aside, left unchanged
  and reported; if it still does not parse, it is left unchanged and reported.
  """
  prepared = [_as_python(source) for source in sources]
  migrations = iter(migrate_modules(
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
                   sorted_reports(reports))


def _joined(source: Union[str, list[str]]) -> str:
  """A cell's source (a string, or a list of lines) as one string."""
  return source if isinstance(source, str) else "".join(source)
