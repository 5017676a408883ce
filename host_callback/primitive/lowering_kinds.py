"""What a host_callback op does on the device, as both transports emit it,
and how its arrays are stored."""

import enum
from typing import Any

import jax
import numpy as np


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


def wire_dtype(dtype: Any) -> np.dtype:
  """How XLA stores the dtype: float0 as bool (one byte each)."""
  return np.dtype(np.bool_) if dtype == jax.dtypes.float0 else np.dtype(dtype)
