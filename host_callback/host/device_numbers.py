"""Device numbers: how queues, sites and packets name a device.

A device's number is its `jax.Device.id` on CPU (what the native handlers
read as XLA's device ordinal), and past `_PLATFORM_STRIDE` times a rank for
any other platform: ids of different platforms overlap (CPU devices 0-3 and
GPU 0 on a machine with one GPU), and a program may use both.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Dict, List

import jax
import numpy as np

_PLATFORM_STRIDE = 1 << 20
_PLATFORM_RANKS = {"cpu": 0, "gpu": 1, "cuda": 1, "rocm": 2, "tpu": 3}
_OTHER_RANK = 4


def device_number(device: Any) -> int:
  """The number that names `device` in queues and packets."""
  rank = _PLATFORM_RANKS.get(device.platform, _OTHER_RANK)
  return rank * _PLATFORM_STRIDE + device.id


def _cpu_devices() -> List[Any]:
  """The CPU's devices; none where JAX has no CPU backend
  (JAX_PLATFORMS=cuda, say)."""
  try:
    return jax.devices("cpu")
  except RuntimeError:
    return []


@functools.lru_cache(maxsize=None)
def _devices() -> Dict[int, Any]:
  """Every device of the default backend and of the CPU, by number."""
  return {device_number(device): device
          for device in {*jax.devices(), *_cpu_devices()}}


def device_by_number(number: int) -> Any:
  """The jax.Device whose number is `number`."""
  return _devices()[number]


@functools.lru_cache(maxsize=None)
def most_devices() -> int:
  """The most devices of one platform that a computation can use here: the
  default backend's or the CPU's (a GPU machine has one GPU and several CPU
  devices with --xla_force_host_platform_device_count). Read at every
  trace of a tap or call: counted once, as `_devices` is listed once."""
  per_platform = collections.Counter(
      device.platform for device in _devices().values())
  return max(per_platform.values())


def local_devices_by_number() -> Dict[int, Any]:
  """This process's devices (default backend and CPU), by number."""
  process = jax.process_index()
  return {number: device for number, device in _devices().items()
          if device.process_index == process}


def numbers(devices: List[Any]) -> List[int]:
  return [device_number(device) for device in devices]


@functools.lru_cache(maxsize=None)
def zero_on(device: Any) -> jax.Array:
  """An int32 zero committed to `device`: what places a tiny computation
  there (the barrier's markers). A concrete array also while JAX traces
  (a barrier called from code being traced)."""
  with jax.ensure_compile_time_eval():
    return jax.device_put(np.int32(0), device)
