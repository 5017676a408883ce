"""What a host_callback op does on the device, as both transports emit it."""

import enum


class Kind(enum.Enum):
  """The three ops a transport emits.

  TAP: sends the arguments and goes on (the outfeed mode).
  TAP_SYNC: sends the arguments and waits until the host function returned
    (the synchronous mode). A tap's outputs are its operands either way.
  CALL: sends the arguments, waits for the host's result and returns it.
  """
  TAP = "tap"
  TAP_SYNC = "tap_sync"
  CALL = "call"
