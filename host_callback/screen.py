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

One lock per screen (`Screen._lock`) guards its rows and draws; it is taken
last, after any lock of tqdm's or of the bars'.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, TextIO

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
  def cleared(self, stream: TextIO) -> Iterator[None]:
    """While a print writes to `stream`: the rows are cleared when it
    shares their terminal, and drawn again below what it wrote."""
    shares = self.live and (stream is self.file or (
        stream in (sys.stdout, sys.stderr) and
        self.file in (sys.stdout, sys.stderr) and _is_terminal(stream)))
    if not shares:
      yield
      return
    with self._lock:
      if self._drawn:
        self._write("\r" + _CLEAR_BELOW)
      try:
        yield
      finally:
        stream.flush()
        self.draw()


_screens_lock = threading.Lock()  # guards _screens
_screens: Dict[int, Screen] = {}  # by id(file): the screens with rows


def add_row(file: TextIO, position: int, owner: object) -> Row:
  """A new row of `owner` at `position` on `file` (see `Screen.add`)."""
  with _screens_lock:
    screen = _screens.get(id(file))
    if screen is None or screen.file is not file:
      screen = _screens[id(file)] = Screen(file)
    return screen.add(position, owner)


def _drop(screen: Screen) -> None:
  with _screens_lock:
    if _screens.get(id(screen.file)) is screen and screen.empty():
      del _screens[id(screen.file)]


@contextlib.contextmanager
def printing_above(stream: TextIO) -> Iterator[None]:
  """Around a print to `stream`: it goes above the open bars."""
  with _screens_lock:
    screens = list(_screens.values())
  with contextlib.ExitStack() as stack:
    for screen in screens:
      stack.enter_context(screen.cleared(stream))
    yield


@atexit.register
def _leave_all() -> None:
  with _screens_lock:
    screens = list(_screens.values())
  for screen in screens:
    screen.leave()
