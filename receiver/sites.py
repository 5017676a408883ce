"""A transport's callback sites, by id: the one table of them.

A site is what one lowering of a host function sends: its consumer and the
dtypes and shapes of its arrays. Each transport owns one `SiteTable`; what
it keeps for a site (the Python transport: how to hand the arrays over;
the native transport: their layout in a packet, `native_sites.py`) is made
once, when the site is registered, and any other copy (the native module's
two, which device threads read without the GIL) is written from here only.
The runtime frees a dead host function's sites by its consumers
(`SiteTable.unregister_consumers`), so nothing else records which sites
are whose.
"""

from __future__ import annotations

import itertools
import threading
from typing import (Callable, Dict, Generic, Iterator, NamedTuple, Optional,
                    Sequence, Tuple, TypeVar)

import numpy as np

Entry = TypeVar("Entry")


class SiteKey(NamedTuple):
  """What makes two registrations one site."""
  consumer_id: int
  dtypes: Tuple[np.dtype, ...]
  shapes: Tuple[Tuple[int, ...], ...]


def site_key(consumer_id: int, dtypes: Sequence[np.dtype],
             shapes: Sequence[Sequence[int]]) -> SiteKey:
  """The key of a site, dtypes and shapes made comparable."""
  return SiteKey(consumer_id, tuple(np.dtype(d) for d in dtypes),
                 tuple(tuple(s) for s in shapes))


class SiteTable(Generic[Entry]):
  """Sites by id, each with what its transport keeps for it (`Entry`).

  Ids are never reused. A registration with the key of a live site gets
  that site's id again. `forget(site_id)` runs as a site is freed (the
  transport drops its copies there). `_lock` guards the tables, and is
  held while an entry is made or forgotten.
  """

  def __init__(self, forget: Callable[[int], None] = lambda site_id: None
               ) -> None:
    self._lock = threading.Lock()
    self._entries: Dict[int, Entry] = {}
    self._keys: Dict[int, SiteKey] = {}
    self._ids: Dict[SiteKey, int] = {}
    self._next_id = itertools.count()
    self._forget = forget

  def register(self, key: SiteKey, make: Callable[[int], Entry]) -> int:
    """The id of the site `key`; a new site's entry is `make(site_id)`."""
    with self._lock:
      site_id = self._ids.get(key)
      if site_id is None:
        site_id = next(self._next_id)
        self._entries[site_id] = make(site_id)
        self._keys[site_id] = key
        self._ids[key] = site_id
      return site_id

  def get(self, site_id: int) -> Optional[Entry]:
    """The entry of a live site; None for a freed or unknown id."""
    return self._entries.get(site_id)

  def __getitem__(self, site_id: int) -> Entry:
    return self._entries[site_id]

  def __contains__(self, site_id: object) -> bool:
    return site_id in self._entries

  def __iter__(self) -> Iterator[int]:
    """The ids of the live sites."""
    return iter(tuple(self._entries))

  def unregister(self, site_id: int) -> None:
    """Frees a site; a device that sends to it from now on fails."""
    with self._lock:
      self._unregister(site_id)

  def unregister_consumers(self, consumer_ids: Sequence[int]) -> None:
    """Frees every site of these consumers."""
    consumers = set(consumer_ids)
    with self._lock:
      for site_id in [site_id for site_id, key in self._keys.items()
                      if key.consumer_id in consumers]:
        self._unregister(site_id)

  def _unregister(self, site_id: int) -> None:
    key = self._keys.pop(site_id, None)
    if key is None:
      return
    del self._entries[site_id], self._ids[key]
    self._forget(site_id)
