"""Memory the native receiver lends to host functions.

A packet of at least `native.LARGE_PACKET_BYTES` (packet.h:kLargePacket)
lies in a block of its own from
the extension module's pool, written once by the device; the host
function's arrays are views of it (`lent_block`), and the block goes back
to the pool once no array views it. Smaller packets are copied in batches
into a `BatchBuffer`, lent to one batch at a time. Either way a packet's
memory is its own: a host function may keep its arrays.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from .native_library import native


def lent_block(block: int, address: int, nbytes: int) -> np.ndarray:
  """A lent block's first `nbytes` as a uint8 array: arrays made from it
  keep, through their bases, the `Memory` that gives the block back."""
  return np.frombuffer(native.Memory(address, nbytes, block), np.uint8)


def return_block(block: int) -> None:
  """Gives a lent block back at once (its packet is dropped)."""
  native.Memory(0, 0, block)  # its end returns the block


class BatchBuffer:
  """Memory that batches are copied into, lent to one batch at a time.

  `lend()` wraps the memory in a new owner (a `Memory`); the arrays decoded
  from that batch are views whose base is the owner, so the memory is free
  for another batch only once the owner and all of them are gone.
  """

  __slots__ = ("_memory", "address", "nbytes", "_owner")

  def __init__(self, nbytes: int) -> None:
    self._memory = np.empty(nbytes, np.uint8)
    self.address = self._memory.ctypes.data
    self.nbytes = nbytes
    self._owner: Callable[[], Any] = lambda: None  # a weak reference

  def is_free(self) -> bool:
    return self._owner() is None

  def lend(self) -> np.ndarray:
    """The memory as a uint8 array whose base is a new owner."""
    owner = native.Memory(self.address, self.nbytes, 0, self._memory)
    self._owner = weakref.ref(owner)
    return np.frombuffer(owner, np.uint8)
