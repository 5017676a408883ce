"""The rows of our open progress bars on an output file, drawn together.

Each bar draws into a `Row`, the file its tqdm writes to; the row keeps the
bar's latest text and its `Screen`, one per output file, draws every open
row. On a terminal the rows stand below the cursor, each on its own fixed
line, in the order of their positions, except that a row goes below the
rows that its owner (a loop) still has from an earlier run;
every draw rewrites them all in one write, so that threads never
interleave partial rows. A row that closes stays in place until every row
before it has closed; then its final text is written for good above the
others. Elsewhere (a log file, a pipe) nothing is drawn but the final rows,
in the same order. `printing_above` lets a print share a terminal with the
rows: it clears them, lets the print write, and draws them again below, as
`tqdm.write` does.

The program's own output shares the terminal too: once it has bars, a
`sys.stdout` that is a terminal is wrapped (`_ProgramOutput`), and while rows
stand on its terminal each line the program writes goes above them once it
has ended. So a `print` after a loop whose bars still draw (asynchronous
dispatch, `pmap`, the outfeed mode) stays intact.

One lock per screen (`Screen._lock`) guards its rows and draws; it is taken
last, after any lock of tqdm's or of the bars'. `_screens_lock` guards the
screens and the program's line, and is taken before a screen's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import (Any, Dict, Iterable, Iterator, List, Optional, Set,
                    TextIO)

_CLEAR_LINE = "\x1b[K"  # from the cursor to the end of its line
_CLEAR_BELOW = "\x1b[J"  # from the cursor to the end of the screen
_UP = "\x1b[A"


class Row:
  """The file a bar's tqdm writes to: keeps the bar's text (what tqdm
  wrote last after a carriage return), and has its screen draw it."""

  def __init__(self, screen: Screen, position: int, owner: object) -> None:
    self.screen = screen
    self.position = position
    self.owner = owner
    self.text = ""
    self.closed = False

  def write(self, data: str) -> None:
    """Takes tqdm's `\\r` + text + padding; drops its cursor moves."""
    data = data.replace("\n", "").replace(_UP, "")
    if "\r" in data:
      self.text = data.rsplit("\r", 1)[1].rstrip(" ")
      self.screen.draw()

  def flush(self) -> None:
    pass

  @property
  def encoding(self) -> Optional[str]:
    """The output file's, so that tqdm picks its characters for it."""
    return getattr(self.screen.file, "encoding", None)

  def fileno(self) -> int:
    """The output file's, so that tqdm can read the terminal's size."""
    return self.screen.file.fileno()

  def width(self) -> Optional[int]:
    """The columns a row may fill on a terminal (one less than the
    terminal's, so that a full row does not wrap), or None elsewhere."""
    return _columns(self.screen.file) - 1 if self.screen.live else None

  def close(self) -> None:
    """The bar closed: its last text stays (tqdm's `leave`), or none."""
    self.screen.close_row(self)


def _is_terminal(file: Any) -> bool:
  try:
    return bool(file.isatty())
  except (AttributeError, ValueError):  # no isatty, or a closed file
    return False


def _same_terminal(a: Any, b: Any) -> bool:
  """Whether `a` and `b` write to one terminal."""
  if a is b:
    return _is_terminal(a)
  try:
    return (_is_terminal(a) and _is_terminal(b) and os.path.samestat(
        os.fstat(a.fileno()), os.fstat(b.fileno())))
  except (AttributeError, OSError, ValueError):
    return False


def _columns(file: TextIO) -> int:
  try:
    return os.get_terminal_size(file.fileno()).columns
  except (AttributeError, OSError, ValueError):
    return 80


class Screen:
  """The open rows of bars on `file`, drawn on a terminal below the
  cursor, or only once final elsewhere."""

  def __init__(self, file: TextIO) -> None:
    self.file = file
    self.live = _is_terminal(file)
    self._lock = threading.RLock()
    self._rows: List[Row] = []  # in the order they stand
    self._drawn = 0  # how many rows stand on the terminal below the cursor

  def add(self, position: int, owner: object) -> Row:
    """A row below those at `position` or before, and those of `owner`."""
    with self._lock:
      row = Row(self, position, owner)
      index = 1 + max((i for i, r in enumerate(self._rows)
                       if r.position <= position or r.owner is owner),
                      default=-1)
      self._rows.insert(index, row)
      return row

  def empty(self) -> bool:
    with self._lock:
      return not self._rows

  def shares(self, stream: Any) -> bool:
    """Whether a print to `stream` lands among these rows."""
    return self.live and _same_terminal(self.file, stream)

  def _block(self) -> str:
    """What redraws the open rows from the top one, where the cursor is
    left: each on its line, the rest of the screen cleared."""
    if not self.live:
      return ""
    width = _columns(self.file) - 1  # a full row would wrap the cursor
    texts = [row.text[:width] for row in self._rows]
    out = "\r" + "\n".join(text + _CLEAR_LINE for text in texts) + _CLEAR_BELOW
    if len(texts) > 1:
      out += _UP * (len(texts) - 1) + "\r"
    self._drawn = len(texts)
    return out

  def _write(self, text: str) -> None:
    if text:
      try:
        self.file.write(text)
        self.file.flush()
      except ValueError:  # closed
        pass

  def draw(self) -> None:
    with self._lock:
      self._write(self._block())

  def close_row(self, row: Row) -> None:
    """Marks `row` closed, and writes for good the leading closed rows
    that have a text, in order; a closed row without text goes."""
    with self._lock:
      row.closed = True
      if not row.text and row in self._rows:
        self._rows.remove(row)
      final = []
      while self._rows and self._rows[0].closed:
        final.append(self._rows.pop(0).text)
      end = _CLEAR_LINE + "\n" if self.live else "\n"
      self._write("".join(("\r" if self.live else "") + text + end
                          for text in final) + self._block())
      empty = not self._rows
    if empty:
      _drop(self)

  def leave(self) -> None:
    """At exit: the open rows stay as drawn, and the cursor goes below."""
    with self._lock:
      if self.live and self._rows:
        self._write("\n" * len(self._rows))
      self._rows.clear()

  @contextlib.contextmanager
  def cleared(self) -> Iterator[None]:
    """While a print that `shares` the rows writes: the rows are cleared,
    and drawn again below what it wrote."""
    with self._lock:
      if self._drawn:
        self._write("\r" + _CLEAR_BELOW)
      try:
        yield
      finally:
        self.draw()


_screens_lock = threading.RLock()  # guards _screens and _program's line
_screens: Dict[int, Screen] = {}  # by id(file): the screens with rows


def _sharing(stream: Any) -> List[Screen]:
  """The screens whose rows a print to `stream` lands among."""
  return [screen for screen in _screens.values() if screen.shares(stream)]


@contextlib.contextmanager
def _above(screens: List[Screen], stream: Any) -> Iterator[None]:
  """While a print writes to `stream`: above the rows of `screens`."""
  with contextlib.ExitStack() as stack:
    for screen in screens:
      stack.enter_context(screen.cleared())
    try:
      yield
    finally:
      flush = getattr(stream, "flush", None)  # an output_stream may lack it
      if screens and flush is not None:
        flush()


class _ProgramOutput:
  """`sys.stdout` once the program has bars, where it is a terminal. It
  writes through, except while rows stand on its terminal: then each line
  goes above them once it has ended, and the line still being written
  waits for its end, or for the rows to close. Each thread's line is its
  own: a line that one thread writes in parts (`print("result", x)` writes
  "result " before it asks `x` for its text) ends on its row whatever
  another thread prints meanwhile (an `id_print`). A line written in part
  when rows open is taken off the screen and written again whole later,
  so that no row draws over it."""

  def __init__(self, stream: TextIO) -> None:
    self.stream = stream
    self._lines: Dict[int, str] = {}  # by thread: what it wrote after its
    # last newline
    self._hidden: Set[int] = set()  # threads whose line the screen lacks

  def __getattr__(self, name: str) -> Any:
    return getattr(self.stream, name)

  def write(self, text: str) -> int:
    with _screens_lock:
      thread = threading.get_ident()
      before = self._lines.pop(thread, "")
      line = (before + text).rpartition("\n")[2]
      if line:
        self._lines[thread] = line
      screens = _sharing(self.stream)
      if not screens:
        self.stream.write((before if thread in self._hidden else "") + text)
        self._hidden.discard(thread)
        return len(text)
      ended, newline, _ = (before + text).rpartition("\n")
      if newline:
        with _above(screens, self.stream):
          self.stream.write(ended + newline)
      if line:
        self._hidden.add(thread)  # it waits for its end, or for the rows
      else:
        self._hidden.discard(thread)
    return len(text)

  def writelines(self, lines: Iterable[str]) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    self.stream.flush()

  def take_back(self) -> None:
    """Rows open on the terminal: the lines being written leave it."""
    shown = [t for t in self._lines if t not in self._hidden]
    if shown:
      self.stream.write("\r" + _CLEAR_LINE)
      self.stream.flush()
      self._hidden.update(shown)

  def give_back(self) -> None:
    """The rows have closed: the lines being written stand again."""
    hidden = [t for t in self._lines if t in self._hidden]
    self._hidden.clear()
    if hidden:
      self.stream.write("".join(self._lines[t] for t in hidden))
      self.stream.flush()


_program: Optional[_ProgramOutput] = None  # sys.stdout, once wrapped


def watch_stdout() -> None:
  """Called when the program makes bars: from now on its lines to a
  terminal `sys.stdout` go above the rows there (see `_ProgramOutput`)."""
  global _program
  with _screens_lock:
    if _program is None and _is_terminal(sys.stdout):
      _program = sys.stdout = _ProgramOutput(sys.stdout)


def add_row(file: TextIO, position: int, owner: object) -> Row:
  """A new row of `owner` at `position` on `file` (see `Screen.add`)."""
  if isinstance(file, _ProgramOutput):
    file = file.stream
  with _screens_lock:
    screen = _screens.get(id(file))
    if screen is None or screen.file is not file:
      screen = _screens[id(file)] = Screen(file)
    if _program is not None and screen.shares(_program.stream):
      _program.take_back()
    return screen.add(position, owner)


def _drop(screen: Screen) -> None:
  with _screens_lock:
    if _screens.get(id(screen.file)) is screen and screen.empty():
      del _screens[id(screen.file)]
    if _program is not None and not _sharing(_program.stream):
      _program.give_back()


@contextlib.contextmanager
def printing_above(stream: TextIO) -> Iterator[None]:
  """Around a print to `stream`: it goes above the open bars."""
  if isinstance(stream, _ProgramOutput):
    yield  # it writes each line above them itself
    return
  with _screens_lock:
    screens = _sharing(stream)
  with _above(screens, stream):
    yield


@atexit.register
def _leave_all() -> None:
  with _screens_lock:
    screens = list(_screens.values())
  for screen in screens:
    screen.leave()
    _drop(screen)
