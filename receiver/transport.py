"""The interface of a transport (how packets leave a device) on both sides.

A transport exists once per process; its device queues outlive receivers.
The lowering uses its producer side, the receiver its lifecycle and
consumer sides.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from .packets import DirectRunParts, Packet
from .sites import SiteTable


@dataclasses.dataclass(frozen=True)
class QueueStats:
  """A snapshot of one device queue."""
  bytes_waiting: int
  packets_waiting: int
  high_water_bytes: int
  max_bytes: int


class Producer(Protocol):
  """What the lowering needs: queues to send to, and callback sites.

  The Python transport also has `send(device_id, site, arrays)` and
  `request(device_id, site, arrays) -> arrays`, which JAX's Python callbacks
  call on the device thread; the native transport's device side is C++
  (`receiver/native/ffi_cpu.cc`).
  """

  name: str

  def open_device(self, device_id: int) -> None:
    """Prepares the queue of a device that may send, before it sends."""

  # The transport's callback sites (`sites.SiteTable`), by id.
  sites: SiteTable[Any]

  def register_site(self, consumer_id: int, dtypes: Sequence[np.dtype],
                    shapes: Sequence[Tuple[int, ...]], *, name: str = "",
                    copy: bool = True, packed_results: bool = False,
                    buffers: bool = False,
                    int_columns: Sequence[int] = ()) -> int:
    """The id that a callback site's packets carry: its consumer and the
    dtypes and shapes of its arrays. `name` is the host function's, `copy`
    False gives it read-only arrays (views where the transport can),
    `packed_results`: a call's results include dtypes packed below a byte
    (`native_wire.packed_bits`), `buffers`: a call that takes the
    device's buffers where the transport can (a GPU's, `device_buffers`),
    and the arrays at `int_columns`, int32 scalars, come to the consumer as
    Python ints (`int_flags`)."""

  def unregister_sites_of(self, consumer_ids: Sequence[int]) -> None:
    """Frees the sites of consumers that no executable uses any more; their
    ids are not reused."""


def int32_scalar(dtype: np.dtype, shape: Tuple[int, ...]) -> bool:
  """Whether an array of `dtype` and `shape` may come as a Python int."""
  return np.dtype(dtype) == np.int32 and tuple(shape) == ()


def int_flags(int_columns: Sequence[int], dtypes: Sequence[np.dtype],
              shapes: Sequence[Tuple[int, ...]]) -> Tuple[bool, ...]:
  """For each array of a site, whether its consumer gets it as a Python int
  (`Producer.register_site`'s `int_columns`): an int32 scalar that the
  consumer reads as a number costs less as an int than as an array that it
  converts."""
  for i in int_columns:
    if not (0 <= i < len(dtypes) and int32_scalar(dtypes[i], shapes[i])):
      raise ValueError(
          f"host_callback: int_columns names array {i}, which is not an "
          "int32 scalar; name only int32 scalars")
  return tuple(i in int_columns for i in range(len(dtypes)))


class Transport(Producer, Protocol):
  """Where the receiver's threads find the packets of each device."""

  def set_restart_hook(self, restart: Callable[[], None]) -> None:
    """`restart()` is called by a device that sends while detached."""

  def clear_restart_hook(self) -> None:
    """From now on a device that needs a receiver fails instead."""

  def set_direct_runner(self, runner: DirectRunParts) -> None:
    """Lets a device whose queue allows it (idle) run a request's host
    function on its own thread, with `runner` (see `DirectRunParts`):
    `runner.run(consumer_id, device_id, arrays)` returns the results or
    raises `DirectRunError`."""

  def close_direct_runs(self) -> None:
    """From now on every direct run goes through `DirectRunParts.run`,
    which refuses them once the run counts are closed."""

  def set_nested_consumer(self, consume: Callable[[int], None]) -> None:
    """Lets a device's consumer thread serve a request it makes of that
    device (a host function running JAX code): `consume(device_id)`
    consumes, in the device's order, what the thread has taken and not yet
    consumed, else the next batch."""

  def set_guest_consumer(self, consume: Callable[[int], None]) -> None:
    """Lets a request that finds packets waiting on its device's queue run
    them first on its own thread: `consume(device_id)` consumes, in the
    device's order, those that no consumer holds (as `barrier_wait`'s guest
    does), and raises KeyboardInterrupt when Ctrl-C stopped one."""

  def attach(self, max_bytes: int, listener: Callable[[int], None]) -> None:
    """A receiver starts: `listener(device_id)` runs for every device queue,
    now and whenever one opens, until `detach`."""

  def detach(self) -> bool:
    """The receiver stopped; True if packets are left for the next one."""

  def take_batch(self, device_id: int, timeout: float) -> List[Packet]:
    """Returns the device's waiting packets in order, waiting up to `timeout`."""

  def mark_finished(self, device_id: int, packet: Packet) -> None:
    """Releases the packet's bytes once its consumer has returned."""

  # Where not None, `mark_count_finished(device_id, count)` does what
  # `mark_finished` of the device's next `count` packets would: a transport
  # that needs no packet for it.
  mark_count_finished: Optional[Callable[[int, int], None]]

  def release(self, device_id: int) -> None:
    """Releases now what `mark_finished` may have deferred."""

  def wait_finished(self, device_id: int, is_stopped: Callable[[], bool]) -> None:
    """Waits until every packet the device has sent so far is consumed."""

  def take_here(self, device_id: int) -> List[Packet]:
    """The device's next waiting packet, for a thread that waits for the
    queue to drain (a barrier) to consume itself instead of waking the
    consumer: taken only when no consumer holds packets of the device and
    none of its host functions runs, and then the device's queue is claimed
    (the consumer takes nothing) until `finish_here`. Empty otherwise."""

  def finish_here(self, device_id: int) -> None:
    """What this thread took with `take_here` is finished (consumed, or
    given up when interrupted): releases it, and the claim. Does nothing
    when the thread holds no such claim."""

  def packets_sent(self, device_id: int) -> int:
    """How many packets the device has ever sent."""

  def packets_waiting(self, device_id: int) -> int:
    """Packets the device has sent that are not consumed yet."""

  def drained(self) -> bool:
    """Whether every packet sent so far, to any queue, has been consumed."""

  def device_ids(self) -> List[int]:
    """The devices whose queues are open."""

  def stats(self, device_id: int) -> QueueStats:
    """Queue statistics for one device."""

  def wake_all(self) -> None:
    """Wakes every waiter so that it re-checks its way out."""
