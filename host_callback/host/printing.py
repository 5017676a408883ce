"""The `id_print` tap function: the legacy output format, byte for byte.

Values are laid out with a small Wadler/Lindig pretty printer (the algorithm
of JAX's own pretty printer, which the original used): a group is printed on
one line when it fits in 80 columns, otherwise each of its breaks starts a new
line indented by the group's nesting.

While progress bars of ours are open on the same terminal, a print goes
above them (`screen.printing_above`, or `sys.stdout` as `screen` wraps it),
as `tqdm.write` does.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple, Union

import numpy as np

from . import screen

WIDTH = 80

# --- A minimal pretty printer -------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Text:
  text: str


@dataclasses.dataclass(frozen=True)
class _Break:
  """A space when its group is flat, a newline plus indentation otherwise."""


@dataclasses.dataclass(frozen=True)
class _Nest:
  indent: int
  child: "Doc"


@dataclasses.dataclass(frozen=True)
class _Group:
  children: Tuple["Doc", ...]


Doc = Union[_Text, _Break, _Nest, _Group, Tuple["Doc", ...]]
_FLAT, _BREAK = False, True


def _fits(doc: Doc, room: int) -> bool:
  """Whether `doc` printed flat takes at most `room` columns."""
  stack: List[Doc] = [doc]
  while stack and room >= 0:
    item = stack.pop()
    if isinstance(item, _Text):
      room -= len(item.text)
    elif isinstance(item, _Break):
      room -= 1
    elif isinstance(item, _Nest):
      stack.append(item.child)
    else:
      children = item.children if isinstance(item, _Group) else item
      stack.extend(reversed(children))
  return room >= 0


def render(doc: Doc, width: int = WIDTH) -> str:
  out: List[str] = []
  column = 0
  stack: List[Tuple[int, bool, Doc]] = [(0, _BREAK, doc)]
  while stack:
    indent, mode, item = stack.pop()
    if isinstance(item, _Text):
      out.append(item.text)
      column += len(item.text)
    elif isinstance(item, _Break):
      if mode == _FLAT:
        out.append(" ")
        column += 1
      else:
        out.append("\n" + " " * indent)
        column = indent
    elif isinstance(item, _Nest):
      stack.append((indent + item.indent, mode, item.child))
    elif isinstance(item, _Group):
      flat = mode == _FLAT or _fits(item, width - column)
      stack.extend((indent, _FLAT if flat else _BREAK, child)
                   for child in reversed(item.children))
    else:
      stack.extend((indent, mode, child) for child in reversed(item))
  return "".join(out)


def _bracketed(opening: str, items: Sequence[Doc], closing: str) -> Doc:
  joined: List[Doc] = []
  for i, item in enumerate(items):
    if i:
      joined.append(_Break())
    joined.append(item)
  return _Group((_Text(opening), _Nest(2, tuple(joined)), _Text(closing)))


def value_doc(value: Any, threshold: Optional[int]) -> Doc:
  """The layout of a tapped value: tuples, lists, dicts, arrays, scalars."""
  if isinstance(value, tuple):
    return _bracketed("( ", [value_doc(v, threshold) for v in value], " )")
  if isinstance(value, list):
    return _bracketed("[ ", [value_doc(v, threshold) for v in value], " ]")
  if isinstance(value, dict):
    return _bracketed("{ ", [(_Text(f"{k}="), value_doc(v, threshold))
                             for k, v in sorted(value.items())], " }")
  if isinstance(value, np.ndarray):
    return _Text(np.array2string(value, threshold=threshold))
  return _Text(str(value))


# --- The printer ------------------------------------------------------------

# Prints from concurrent taps never interleave.
_print_lock = threading.Lock()


def header_line(kwargs: Dict[str, Any], transforms: Sequence[Tuple[Any, ...]],
                device: Any) -> str:
  """`k1: v1 k2: v2` with keys sorted, or '' when there is nothing to say."""
  fields = dict(kwargs)
  if transforms:
    # As the original: an entry without params prints as its name alone.
    fields["transforms"] = [entry if len(entry) > 1 and entry[1] else entry[0]
                            for entry in transforms]
  if device is not None:
    fields["device"] = device
  return " ".join(f"{k}: {v}" for k, v in sorted(fields.items()))


class Printer:
  """The tap function behind `id_print`."""

  def __init__(self, output_stream: Optional[TextIO], threshold: Optional[int],
               kwargs: Dict[str, Any]) -> None:
    self.output_stream = output_stream
    self.threshold = threshold
    self.kwargs = kwargs

  def _key(self) -> Optional[Tuple[Any, ...]]:
    """What printing depends on, when hashable (so not for arrays or
    tracers among the kwargs, which make a printer equal only to itself)."""
    key = (id(self.output_stream), self.threshold,
           tuple(sorted(self.kwargs.items())))
    try:
      hash(key)
    except TypeError:
      return None
    return key

  def __eq__(self, other: object) -> bool:
    """Printers that print alike are equal, so that repeated eager
    `id_print`s share one compilation."""
    if not isinstance(other, Printer):
      return NotImplemented
    key = self._key()
    return self is other or (key is not None and key == other._key())

  def __hash__(self) -> int:
    key = self._key()
    return hash(key) if key is not None else id(self)

  def _emit(self, line: str) -> None:
    if self.output_stream is not None:
      self.output_stream.write(line + "\n")
    else:
      print(line)

  def __call__(self, arg: Any, transforms: Sequence[Tuple[Any, ...]], *,
               device: Any = None) -> None:
    header = header_line(self.kwargs, transforms, device)
    text = render(value_doc(arg, self.threshold))
    stream = self.output_stream or sys.stdout  # where print writes
    with _print_lock, screen.printing_above(stream):
      if header:
        self._emit(header)
      self._emit(text)
