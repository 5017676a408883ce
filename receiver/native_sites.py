"""The native transport's callback sites, by id: the owner of the site table.

`register_site` lays out, at lowering time, the arrays of each callback site
(`native_wire.Column`) and records them with its consumer here. The
extension module keeps two copies, which only this module writes, through
the module's `register_site` and `unregister_site`: the byte sizes the
device's arrays must have (`native/site_sizes.h:SiteSizes`, read by device
threads without the GIL) and the dtypes, shapes and unpackers the direct
runner builds arrays of (`native/python_sites.h`).
`tests/test_native_sites.py` checks that both say what this table says.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Dict, Sequence, Tuple

import numpy as np

from .native_library import native
from .native_wire import Column, align, column
from .transport import int_flags


@dataclasses.dataclass(frozen=True)
class Site:
  """A callback site: its consumer, its arrays and its packets' size.
  `read_only`: its host function asked for `copy=False`; `buffers`: for
  `buffers=True`, which on a GPU runs on the device's buffers; `ints`: for
  each array, whether the consumer gets it as a Python int (an int32
  scalar, `Transport.register_site`'s `int_columns`)."""
  consumer_id: int
  columns: Tuple[Column, ...]
  packet_bytes: int
  read_only: bool
  buffers: bool
  ints: Tuple[bool, ...]


_sites_lock = threading.Lock()  # guards the three tables below
sites: Dict[int, Site] = {}
_site_ids: Dict[tuple, int] = {}
_next_site_id = itertools.count()


def _key(consumer_id: int, dtypes: Sequence[np.dtype],
         shapes: Sequence[Tuple[int, ...]]) -> tuple:
  """What makes two registrations one site."""
  return (consumer_id, tuple(np.dtype(d) for d in dtypes),
          tuple(tuple(s) for s in shapes))


def register_site(consumer_id: int, dtypes: Sequence[np.dtype],
                  shapes: Sequence[Tuple[int, ...]], *, name: str,
                  copy: bool, packed_results: bool, buffers: bool,
                  int_columns: Sequence[int] = ()) -> int:
  """The id to put in the packets of a callback site.

  The site's packets carry arrays of these dtypes and shapes, for the
  consumer `consumer_id` (of the host function `name`, which asked for
  copies or not, and whose results, for a call, include dtypes packed below
  a byte when `packed_results`; `buffers`: a GPU's direct run hands it the
  device's buffers, `native/python_runner.h`; the arrays of `int_columns`,
  int32 scalars, come as Python ints). Ids are never reused.
  """
  assert native is not None, "the native transport is not built"
  key = _key(consumer_id, dtypes, shapes)
  ints = int_flags(int_columns, key[1], key[2])
  with _sites_lock:
    site_id = _site_ids.get(key)
    if site_id is not None:
      return site_id
    columns, offset = [], native.HEADER_BYTES
    for dtype, shape in zip(key[1], key[2]):
      columns.append(column(offset, dtype, shape))
      offset += align(columns[-1].nbytes)
    site_id = next(_next_site_id)
    native.register_site(
        site_id, [c.nbytes for c in columns], consumer_id, name,
        [c.dtype for c in columns], [c.shape for c in columns],
        [c.unpacker() for c in columns], list(ints), copy, packed_results,
        buffers)
    _site_ids[key] = site_id
    sites[site_id] = Site(consumer_id, tuple(columns), offset, not copy,
                          buffers, ints)
    return site_id


def unregister_site(site_id: int) -> None:
  """Frees a site; a device that sends to it from now on fails, and its
  packets still queued are dropped with an error."""
  assert native is not None
  with _sites_lock:
    site = sites.pop(site_id, None)
    if site is None:
      return
    del _site_ids[_key(site.consumer_id, [c.dtype for c in site.columns],
                       [c.shape for c in site.columns])]
    native.unregister_site(site_id)
