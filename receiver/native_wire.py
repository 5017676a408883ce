"""The native transport's wire format: where a packet's arrays lie.

A packet is a header (`native/packet.h:PacketHeader`, `native.HEADER_BYTES`)
followed by its arrays, each starting at a multiple of `native.ALIGN_BYTES`.
It carries a site id instead of shapes: `native_sites.register_site` lays
out each callback site's arrays as `Column`s.

An array takes its XLA size: sub-byte dtypes (int4, uint4, int2, uint2,
float4_e2m1fn) are packed, several elements to a byte with the first in the
lowest bits; host functions get them one element per byte, as NumPy
(ml_dtypes) stores them, and a call's results are packed again for the
device.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Tuple

import numpy as np

from .native_library import native


def align(n: int) -> int:
  """`n` rounded up to where an array may start (packet.h:kAlign)."""
  unit = native.ALIGN_BYTES
  return (n + unit - 1) // unit * unit


def packed_bits(dtype: np.dtype) -> Optional[int]:
  """The bits per element of a dtype XLA packs below a byte, else None."""
  if dtype.itemsize != 1 or dtype.type.__module__ != "ml_dtypes":
    return None
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  try:
    bits = ml_dtypes.iinfo(dtype).bits
  except ValueError:
    bits = ml_dtypes.finfo(dtype).bits
  return bits if bits in (1, 2, 4) else None


def unpack(packed: np.ndarray, dtype: np.dtype, shape: Tuple[int, ...],
           bits: int) -> np.ndarray:
  """A new array of `shape` from XLA's packed bytes, one element per byte."""
  shifts = np.arange(0, 8, bits, dtype=np.uint8)
  codes = (packed.reshape(-1, 1) >> shifts) & np.uint8((1 << bits) - 1)
  size = int(np.prod(shape, dtype=np.int64))
  return codes.reshape(-1)[:size].view(dtype).reshape(shape)


def _pack(array: np.ndarray, bits: int) -> np.ndarray:
  """XLA's packed bytes of `array` (a sub-byte dtype, one element per byte)."""
  per_byte = 8 // bits
  codes = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
  codes = np.pad(codes & np.uint8((1 << bits) - 1),
                 (0, -codes.size % per_byte)).reshape(-1, per_byte)
  shifts = np.arange(0, 8, bits, dtype=np.uint8)
  return np.bitwise_or.reduce(codes << shifts, axis=1).astype(np.uint8)


def wire_array(array: Any) -> np.ndarray:
  """A result as the device stores it, C-contiguous: the array itself when
  it already is (so that it is copied once, into the device's buffer), else
  a packed or contiguous copy."""
  array = np.asarray(array)
  bits = packed_bits(array.dtype)
  if bits is not None:
    return _pack(array, bits)
  return array if array.flags.c_contiguous else np.ascontiguousarray(array)


@dataclasses.dataclass(frozen=True)
class Column:
  """Where one array of a site's packets lies, and what it is.

  `packed_bits` is set for a sub-byte dtype, whose `nbytes` are packed.
  """
  offset: int
  dtype: np.dtype
  shape: Tuple[int, ...]
  strides: Tuple[int, ...]
  nbytes: int
  packed_bits: Optional[int]

  def array(self, data: np.ndarray, offset: int) -> np.ndarray:
    """The column's array in the packet at `offset` of `data`: a view, or a
    new unpacked array for a sub-byte dtype."""
    if self.packed_bits is None:
      return np.ndarray(self.shape, self.dtype, data, offset + self.offset)
    start = offset + self.offset
    return unpack(data[start:start + self.nbytes], self.dtype, self.shape,
                  self.packed_bits)

  def unpacker(self) -> Optional[Any]:
    """For the direct runner: a function from the packed bytes (a uint8
    array) to the array, for a sub-byte dtype; None for the others."""
    if self.packed_bits is None:
      return None
    return functools.partial(unpack, dtype=self.dtype, shape=self.shape,
                             bits=self.packed_bits)


def column(offset: int, dtype: np.dtype, shape: Tuple[int, ...]) -> Column:
  """The column of an array of `dtype` and `shape` at `offset`."""
  size = int(np.prod(shape, dtype=np.int64))
  strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
                  for i in range(len(shape)))
  bits = packed_bits(dtype)
  nbytes = dtype.itemsize * size if bits is None else -(-size * bits // 8)
  return Column(offset, dtype, shape, strides, nbytes, bits)
