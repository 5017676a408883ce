"""Packets of a batch taken from a native queue, decoded into NumPy views;
and the replies to the requests among them."""

from __future__ import annotations

import itertools
import logging
from typing import Any, List, Optional, Sequence

import numpy as np

from .instances import new_instance
from .native_library import native
from .native_memory import lent_block, return_block
from .native_sites import Site, sites
from .native_wire import wire_array
from .packets import Packet, error_message

_logger = logging.getLogger("host_callback")


class NativeReply:
  """The reply to one request packet: delivered straight to the waiting
  device."""

  __slots__ = ("_request_id", "done")

  def __init__(self, request_id: int) -> None:
    self._request_id = request_id
    self.done = False  # answered, with a result or an error

  def set_result(self, arrays: Sequence[np.ndarray]) -> None:
    """Copies the result arrays into the device's output buffers.

    When their sizes do not match the device's buffers, the device fails
    and this raises ValueError, which the receiver records like any other
    host function error.
    """
    try:
      outcome = native.reply(self._request_id, [wire_array(a) for a in arrays])
    except (MemoryError, RuntimeError) as error:
      self.set_error(error)
      return
    self.done = True
    if outcome == native.REPLY_SIZE_MISMATCH:
      raise ValueError(
          "host_callback: a call's results ("
          + ", ".join(f"{a.dtype}{list(a.shape)}"
                      for a in map(np.asarray, arrays))
          + ") do not have the byte sizes its device expects; the device "
          "fails")

  def set_error(self, error: BaseException, context: str = "") -> None:
    """Makes the waiting device computation fail with `error`'s message."""
    self.done = True
    native.reply_error(self._request_id, error_message(error, context))


def _drop(device: Any, row: List[int], site: Optional[Site]) -> None:
  """Drops a packet that does not match its site: logs why, and fails its
  device if it waits (a request)."""
  site_id, request_id, size = row[1:4]
  if site is None:
    reason = (f"host_callback: device {device.device_id} sent a packet to "
              f"callback site {site_id}, which was unregistered")
  else:
    reason = (f"host_callback: device {device.device_id} sent a packet of "
              f"{size} bytes to callback site {site_id}, which expects "
              f"{site.packet_bytes}")
  _logger.error("%s; it is dropped", reason)
  if request_id:
    NativeReply(request_id).set_error(RuntimeError(reason))
  device.finish(1)


def _as_site_gives(arrays: List[np.ndarray], site: Site) -> List[Any]:
  """A packet's arrays as its consumer gets them: read-only for a site of
  copy=False, Python ints where the site says so."""
  if site.read_only:
    for array in arrays:
      array.flags.writeable = False
  if True not in site.ints:
    return arrays
  return [int(a) if as_int else a for a, as_int in zip(arrays, site.ints)]


def _taps_of_one_site(data: np.ndarray, index: np.ndarray, device: Any
                      ) -> Optional[List[Packet]]:
  """The packets of a batch of more than one tap packet, all of one known
  site and small (no block: one after the other in `data`), made in C
  with no list of rows; None for any other batch."""
  if len(index) < 2:
    return None
  site_id = int(index[0, 1])
  site = sites.get(site_id)
  if (site is None or index[:, 2].any() or index[:, 4].any() or
      not (index[:, 1] == site_id).all() or
      not (index[:, 3] == site.packet_bytes).all()):
    return None
  return _tap_packets(site, site_id, device.device_id, data,
                      int(index[0, 0]), len(index))


def _tap_packets(site: Site, site_id: int, device_id: int, data: np.ndarray,
                 offset: int, count: int) -> Optional[List[Packet]]:
  """The Packets of `count` small tap packets of `site` that lie one after
  the other from `offset` in `data`, made in C; None where the site has a
  column packed below a byte."""
  return native.tap_packets(Packet, site.consumer_id, device_id, site_id,
                            data, offset, count, site.read_only)


def decode(data: np.ndarray, index: np.ndarray, device: Any
           ) -> List[Packet]:
  """The packets of a batch, their arrays views over `data` or over their
  own blocks.

  `index` has a row (offset, site, request id, size, block, address) per
  packet. A batch of small taps of one site, the usual one, is made at once
  (`_taps_of_one_site`). A large packet (with a block) is decoded alone, its
  arrays views of its block. Consecutive small packets of one site lie at a
  fixed stride in `data`: a run of taps is made in C (`_tap_packets`); else
  each of the site's arrays is one strided view whose rows are the
  packets' arrays (sub-byte arrays are unpacked into new arrays instead). A
  packet whose site is unknown or whose size is not its site's is dropped
  (`_drop`). The arrays of a site registered with copy=False are read-only,
  and those its `ints` name are Python ints.
  """
  packets = _taps_of_one_site(data, index, device)
  if packets is not None:
    return packets
  packets = []
  rows: List[List[int]] = index.tolist()
  start, count = 0, len(rows)
  device_id = device.device_id
  while start < count:
    offset, site_id, request_id, _, block, address = rows[start]
    stop = start + 1
    if not block:
      while stop < count and rows[stop][1] == site_id and not rows[stop][4]:
        stop += 1
    site = sites.get(site_id)
    run_rows = rows[start:stop]
    start = stop
    if site is None or any(row[3] != site.packet_bytes for row in run_rows):
      for row in run_rows:
        if row[4]:
          return_block(row[4])
        _drop(device, row, site)
      continue
    run = len(run_rows)
    if run == 1:  # a large packet, or the usual batch of a `call`
      memory = lent_block(block, address, site.packet_bytes) if block else data
      arrays = [c.array(memory, 0 if block else offset) for c in site.columns]
      packets.append(Packet(
          site.consumer_id, device_id, _as_site_gives(arrays, site),
          NativeReply(request_id) if request_id else None))
      continue
    if not request_id:  # taps
      made = _tap_packets(site, site_id, device_id, data, offset, run)
      if made is not None:
        packets.extend(made)
        continue
    columns = []
    for column, as_int in zip(site.columns, site.ints):
      if column.packed_bits is not None:
        columns.append([column.array(data, row[0]) for row in run_rows])
        continue
      view = np.ndarray((run,) + column.shape, column.dtype, data,
                        offset + column.offset,
                        (site.packet_bytes,) + column.strides)
      if site.read_only:
        view.flags.writeable = False
      # A row of a 1-d view would be a NumPy scalar: keep 0-d arrays.
      columns.append(view.tolist() if as_int
                     else list(view) if column.shape
                     else [view[i, ...] for i in range(run)])
    arrays = zip(*columns) if columns else itertools.repeat((), run)
    replies = (map(NativeReply, [row[2] for row in run_rows])
               if request_id else itertools.repeat(None, run))
    # new_instance: a Packet made in C, at half the cost of its __init__.
    packets.extend(map(new_instance, itertools.repeat(Packet, run),
                       itertools.repeat(site.consumer_id, run),
                       itertools.repeat(device_id, run), arrays, replies))
  return packets
