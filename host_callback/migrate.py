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

This module is the command line; the codemod is in `host_callback.migration`
(`analysis`, `rewriting`, `notebooks`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

MISSING_LIBCST = ('host_callback.migrate needs libcst, the migrate extra; '
                  'install it with: pip install libcst (or, in a '
                  'host-callback checkout: pip install ".[migrate]")')

try:
  import libcst as cst
  import libcst.metadata  # noqa: F401  (the codemod's parts need it)
except ModuleNotFoundError as import_error:  # the optional `migrate` extra
  if (import_error.name or "").partition(".")[0] != "libcst":
    raise
  if __name__ == "__main__":
    print(MISSING_LIBCST, file=sys.stderr)
    sys.exit(2)
  raise ModuleNotFoundError(MISSING_LIBCST, name="libcst") from import_error

# After the check for libcst.  pylint: disable=wrong-import-position
from .migration.common import (  # noqa: E402  (re-exported)
    ID_TAP_KEYWORDS, LEGACY_MODULE, NEW_MODULE, PUBLIC_NAMES, SETTING_HINTS,
    SETTING_HINT_DEFAULT, SUPPORTED_SETTINGS, Migration, MigrationError,
    Report)
from .migration.notebooks import migrate_cells, migrate_notebook  # noqa: E402
from .migration.rewriting import migrate_source  # noqa: E402

__all__ = [
    "ID_TAP_KEYWORDS", "LEGACY_MODULE", "MISSING_LIBCST", "Migration",
    "MigrationError", "NEW_MODULE", "PUBLIC_NAMES", "Report",
    "SETTING_HINTS", "SETTING_HINT_DEFAULT", "SUPPORTED_SETTINGS",
    "iter_sources", "main", "migrate_cells", "migrate_notebook",
    "migrate_source", "migrate_text",
]

_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})


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
