"""A GPU's buffers lent to a `buffers=True` call's host function.

The native runner (`native/python_runner.h`) makes a `CudaBuffer` over each
operand (read-only) and each result buffer (writable bytes, which the
consumer types) of a call that runs directly on a GPU. A buffer exports
DLPack (`kDLCUDA` and the GPU's ordinal) and `__cuda_array_interface__`
(version 3, with the computation's stream), and `copy_from` copies a
returned GPU array into a result buffer on that stream. Valid only while
the host function runs: the runner releases a buffer that was kept, and a
released one exports nothing. No JAX here.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .native_library import native

DLPACK_CUDA = 2  # DLPack's kDLCUDA
# DLPack's type codes (kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool) by
# NumPy's kind, and kDLBfloat for ml_dtypes' bfloat16.
_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DLPACK_BFLOAT = 4
# Stream numbers a consumer may pass: "do not synchronize".
_NO_SYNC = -1


def _dlpack_dtype(dtype: np.dtype) -> Tuple[int, int]:
  """(type code, bits) of `dtype` in DLPack, or BufferError."""
  if dtype.name == "bfloat16":
    return _DLPACK_BFLOAT, 16
  code = _DLPACK_CODES.get(dtype.kind)
  if code is None:
    raise BufferError(f"DLPack has no type for {dtype}")
  return code, dtype.itemsize * 8


def _c_contiguous(shape: Tuple[int, ...], strides: Optional[Tuple[int, ...]],
                  itemsize: int) -> bool:
  """Whether `__cuda_array_interface__` strides (None: C order) are C's."""
  if strides is None:
    return True
  expected = itemsize
  for extent, stride in zip(reversed(shape), reversed(strides)):
    if extent > 1 and stride != expected:
      return False
    expected *= extent
  return True


class CudaBuffer:
  """A GPU's buffer: `shape` and `dtype` at `address` on GPU `gpu`, made on
  `stream` (the `cudaStream_t` as an int), writable or read-only. `base`: a
  buffer this one types (it keeps it referenced)."""

  def __init__(self, address: int, dtype: Any, shape: Tuple[int, ...],
               gpu: int, stream: int, writable: bool,
               base: Optional[CudaBuffer] = None) -> None:
    self.address = address
    self.dtype = np.dtype(dtype)
    self.shape = tuple(shape)
    self.gpu = gpu
    self.stream = stream
    self.writable = writable
    self._base = base
    self._released = False

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

  def __repr__(self) -> str:
    return (f"CudaBuffer({self.dtype.name}{list(self.shape)} on GPU "
            f"{self.gpu}{'' if self.writable else ', read-only'})")

  def release(self) -> None:
    """The call ended: exports fail from now on."""
    self._released = True

  def _check_live(self) -> None:
    if self._released or (self._base is not None and self._base._released):
      raise BufferError(
          "host_callback: a GPU buffer of a buffers=True call is valid only "
          "while its host function runs")

  def typed(self, dtype: Any, shape: Tuple[int, ...]) -> CudaBuffer:
    """This buffer's bytes as `shape` and `dtype` (as many bytes)."""
    typed = CudaBuffer(self.address, dtype, shape, self.gpu, self.stream,
                       self.writable, base=self)
    assert typed.nbytes == self.nbytes, (typed, self)
    return typed

  def __dlpack_device__(self) -> Tuple[int, int]:
    return DLPACK_CUDA, self.gpu

  def __dlpack__(self, *, stream: Optional[int] = None,
                 max_version: Optional[Tuple[int, int]] = None,
                 dl_device: Optional[Tuple[int, int]] = None,
                 copy: Optional[bool] = None) -> Any:
    """A DLPack capsule over the buffer (versioned, with its read-only flag,
    when the consumer takes DLPack 1.0). A consumer `stream` other than
    the computation's (or -1) waits for the computation's stream first."""
    self._check_live()
    if copy:
      raise BufferError("host_callback: a GPU buffer exports without a copy")
    if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
      raise BufferError(f"host_callback: a buffer of GPU {self.gpu} cannot "
                        f"be exported to DLPack device {tuple(dl_device)}")
    if stream not in (_NO_SYNC, self.stream):
      native.cuda_synchronize(self.stream)
    code, bits = _dlpack_dtype(self.dtype)
    versioned = max_version is not None and max_version[0] >= 1
    return native.dlpack_capsule(self, self.address, list(self.shape), code,
                                 bits, DLPACK_CUDA, self.gpu,
                                 not self.writable, versioned)

  @property
  def __cuda_array_interface__(self) -> Dict[str, Any]:
    """Version 3, with the stream the data is made on (1, the legacy
    default stream, for XLA's null stream)."""
    self._check_live()
    return {"shape": self.shape, "typestr": self.dtype.str,
            "data": (self.address, not self.writable), "version": 3,
            "strides": None, "stream": self.stream or 1}

  def copy_from(self, array: Any) -> None:
    """Copies `array`, an array on this GPU of this shape and dtype that
    exports `__cuda_array_interface__`, into this buffer on its stream:
    ValueError or TypeError saying what differs. Made on another stream,
    `array` is waited for first, and the copy is waited for before it is
    freed."""
    self._check_live()
    device = getattr(array, "__dlpack_device__", None)
    if device is None:
      raise TypeError(f"a {type(array).__name__}, which exports no DLPack "
                      "device")
    where = tuple(int(d) for d in device())
    if where != self.__dlpack_device__():
      raise ValueError(f"an array on DLPack device {where}, not on this "
                       f"GPU {self.__dlpack_device__()}")
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
      raise TypeError(f"a {type(array).__name__} without "
                      "__cuda_array_interface__")
    dtype, shape = np.dtype(interface["typestr"]), tuple(interface["shape"])
    if dtype != self.dtype or shape != self.shape:
      raise ValueError(f"{dtype.name}{list(shape)}")
    if not _c_contiguous(shape, interface.get("strides"), dtype.itemsize):
      raise ValueError("an array that is not C-contiguous")
    self._copy(int(interface["data"][0]), interface.get("stream"))

  def _copy(self, source: int, source_stream: Optional[int]) -> None:
    """The copy from `source`, made on `source_stream` (None: ready)."""
    if source == self.address or self.nbytes == 0:
      return  # filled in place
    foreign = source_stream is not None and source_stream != self.stream
    if foreign:
      native.cuda_synchronize(source_stream)
    native.cuda_copy_on_device(self.address, source, self.nbytes, self.stream)
    if foreign:  # its memory may be reused on its own stream once freed
      native.cuda_synchronize(self.stream)
