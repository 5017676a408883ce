"""Consumers (host functions) by id, stable for the life of the process."""

from __future__ import annotations

import threading
from typing import Callable, Dict, Hashable, List, Optional, Sequence

import numpy as np

# A consumer gets the packet's arrays and the sending device's id, and returns
# the arrays of the reply (for a `call`) or None (for a tap).
Consumer = Callable[[Sequence[np.ndarray], int], Optional[Sequence[np.ndarray]]]


class ConsumerRegistry:
  """Assigns each distinct consumer a small integer id, never reused.

  Ids are embedded in compiled executables, so an id keeps meaning the same
  consumer for as long as the process lives. The lock guards both tables.
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._ids: Dict[Hashable, int] = {}
    self._consumers: List[Consumer] = []
    self._contexts: List[str] = []

  def register(self, key: Hashable, consumer: Consumer,
               context: str = "") -> int:
    """Returns the id of `key`, registering `consumer` under it if new.

    `context` names the consumer in the error of a device that waits for it
    (empty when the consumer's own errors say it).
    """
    with self._lock:
      consumer_id = self._ids.get(key)
      if consumer_id is None:
        consumer_id = self._ids[key] = len(self._consumers)
        self._consumers.append(consumer)
        self._contexts.append(context)
      return consumer_id

  def get(self, consumer_id: int) -> Consumer:
    return self._consumers[consumer_id]

  def context(self, consumer_id: int) -> str:
    return self._contexts[consumer_id]
