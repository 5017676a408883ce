"""The native transport's callback sites: its `sites.SiteTable`, and the
layout of each site's packets.

`register_site` lays out, at lowering time, the arrays of each callback site
(`native_wire.Column`) and records them with its consumer in `sites`. The
extension module keeps two copies, which only this table writes, through
the module's `register_site` and `unregister_site`: the byte sizes the
device's arrays must have (`native/site_sizes.h:SiteSizes`, read by device
threads without the GIL) and the dtypes, shapes and unpackers the direct
runner builds arrays of (`native/python_sites.h`).
`tests/test_native_sites.py` checks that both say what this table says.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

import numpy as np

from .native_library import native
from .native_wire import Column, align, column
from .sites import SiteKey, SiteTable, site_key
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


def _forget(site_id: int) -> None:
  if native is not None:
    native.unregister_site(site_id)


# The table; a device that sends to a site it frees fails, and the site's
# packets still queued are dropped with an error.
sites: SiteTable[Site] = SiteTable(_forget)


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
  key = site_key(consumer_id, dtypes, shapes)
  ints = int_flags(int_columns, key.dtypes, key.shapes)
  return sites.register(
      key, lambda site_id: _laid_out(site_id, key, ints, name=name, copy=copy,
                                     packed_results=packed_results,
                                     buffers=buffers))


def _laid_out(site_id: int, key: SiteKey, ints: Tuple[bool, ...], *,
              name: str, copy: bool, packed_results: bool,
              buffers: bool) -> Site:
  """A new site's layout, copied into the module."""
  columns, offset = [], native.HEADER_BYTES
  for dtype, shape in zip(key.dtypes, key.shapes):
    columns.append(column(offset, dtype, shape))
    offset += align(columns[-1].nbytes)
  native.register_site(
      site_id, [c.nbytes for c in columns], key.consumer_id, name,
      [c.dtype for c in columns], [c.shape for c in columns],
      [c.unpacker() for c in columns], list(ints), copy, packed_results,
      buffers)
  return Site(key.consumer_id, tuple(columns), offset, not copy, buffers,
              ints)

