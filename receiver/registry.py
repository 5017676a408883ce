"""Consumers (host functions) by id; an id is never reused."""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

# A consumer gets the packet's arrays and the sending device's id, and returns
# the arrays of the reply (for a `call`) or None (for a tap). A call's
# consumer run directly may also get `outputs`, the device's result buffers
# as writable bytes (runner.py:HostFunctionRunner.direct_parts), and return views of them once it
# filled them; on a GPU, also the computation's `stream`, with its arrays
# and outputs the GPU's buffers (device_buffers.CudaBuffer).
Consumer = Callable[..., Optional[Sequence[np.ndarray]]]
# What names a consumer in errors; a function when the consumer runs
# different host functions (it is called right after one raised, there).
Context = Union[str, Callable[[], str]]


class ConsumerRegistry:
  """Assigns each consumer a small integer id, never reused.

  Ids are embedded in compiled executables. A consumer stays until
  `remove`d, which its owner does once no executable can send to it any
  more. The lock guards the table.
  """

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._next_id = itertools.count()
    self._consumers: Dict[int, Consumer] = {}
    self._contexts: Dict[int, Context] = {}

  def add(self, consumer: Consumer, context: Context = "") -> int:
    """Registers `consumer` under a new id.

    `context` names the consumer in the error of a device that waits for it
    (empty when the consumer's own errors say it).
    """
    with self._lock:
      consumer_id = next(self._next_id)
      self._contexts[consumer_id] = context
      self._consumers[consumer_id] = consumer
      return consumer_id

  def remove(self, consumer_ids: Iterable[int]) -> None:
    with self._lock:
      self.discard(consumer_ids)

  def discard(self, consumer_ids: Iterable[int]) -> None:
    """`remove` without the lock, for a finalizer: it may run on a thread
    that holds the lock (in `add`), and each dict operation is atomic."""
    for consumer_id in consumer_ids:
      self._consumers.pop(consumer_id, None)
      self._contexts.pop(consumer_id, None)

  @property
  def consumers(self) -> Dict[int, Consumer]:
    """The table itself, for the direct runs' path (`DirectRunParts`), which
    reads it and never writes it."""
    return self._consumers

  def get(self, consumer_id: int) -> Consumer:
    consumer = self._consumers.get(consumer_id)  # one lookup: runs per packet
    if consumer is None:
      raise LookupError(
          f"host_callback: a packet arrived for host function #{consumer_id}, "
          "which was released because no computation used it any more; "
          "please report this")
    return consumer

  def context(self, consumer_id: int) -> str:
    """What names the consumer in the error of a device that waited for it;
    call it on the thread where the consumer raised, right after."""
    context = self._contexts.get(consumer_id, "")
    return context() if callable(context) else context

  def __len__(self) -> int:
    return len(self._consumers)


class Tickets:
  """One-shot consumers, by ticket: a consumer that a packet names at run
  time (the eager ops' tickets), held until that packet has taken it.
  Tickets are 31-bit (they travel as int32 scalars) and wrap around."""

  MASK = 0x7FFFFFFF

  def __init__(self) -> None:
    self._numbers = itertools.count()
    self._entries: Dict[int, Tuple[Consumer, str]] = {}

  def issue(self, consumer: Consumer, context: str) -> int:
    """A new ticket for `consumer`, named `context` in errors."""
    ticket = next(self._numbers) & self.MASK  # atomic under the GIL
    self._entries[ticket] = (consumer, context)
    return ticket

  def take(self, ticket: int) -> Tuple[Consumer, str]:
    """The consumer of `ticket`, which is then forgotten."""
    return self._entries.pop(ticket)

  def drop(self, ticket: int) -> None:
    """Forgets a ticket whose packet will never come."""
    self._entries.pop(ticket, None)
