"""The interface between a transport (how packets leave a device) and the receiver."""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Protocol

from .packets import Packet


@dataclasses.dataclass(frozen=True)
class QueueStats:
  """A snapshot of one device queue."""
  bytes_waiting: int
  packets_waiting: int
  high_water_bytes: int
  max_bytes: int


class Transport(Protocol):
  """Where the receiver's threads find the packets of each device."""

  name: str

  def set_new_device_listener(self, listener: Callable[[int], None]) -> None:
    """`listener(device_key)` is called once for each device that sends."""

  def take_batch(self, device_key: int, timeout: float) -> List[Packet]:
    """Returns the device's waiting packets in order, waiting up to `timeout`."""

  def mark_finished(self, device_key: int, packet: Packet) -> None:
    """Releases the packet's bytes once its consumer has returned."""

  def wait_finished(self, device_key: int, is_stopped: Callable[[], bool]) -> None:
    """Waits until every packet the device has sent so far is consumed."""

  def device_keys(self) -> List[int]:
    """The devices that have sent at least one packet."""

  def stats(self, device_key: int) -> QueueStats:
    """Queue statistics for one device."""

  def wake_all(self) -> None:
    """Wakes every waiter so that it re-checks the stop flag."""


# Builds a transport, given the function that tells whether its receiver stopped.
TransportFactory = Callable[[Callable[[], bool]], Transport]
