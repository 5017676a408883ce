"""Listeners told when a host function's exception stops a device's
computation: a `call` that raises fails it in both modes, a tap only in the
synchronous mode (in the outfeed mode the device does not wait for taps).

The progress bars close the bars of the device with it. Listeners run on the
device's thread, right after the host function raised; what they raise is
logged and dropped.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, List

from .. import settings
from .device_numbers import device_by_number

logger = logging.getLogger("host_callback")

Listener = Callable[[int], None]  # called with the device's number
_listeners: List[Listener] = []
_lock = threading.Lock()  # guards _listeners; held while adding only


def add_listener(listener: Listener) -> None:
  """Calls `listener(device_number)` at each failure from now on."""
  with _lock:
    if listener not in _listeners:
      _listeners.append(listener)


def notify(device_number: int, *, is_call: bool) -> None:
  """Tells the listeners, if the failed host function stops the device."""
  if not is_call and settings.outfeed_mode(
      device_by_number(device_number).platform):
    return
  for listener in tuple(_listeners):
    try:
      listener(device_number)
    except Exception:  # pylint: disable=broad-except
      logger.exception("host_callback: a failure listener raised")
