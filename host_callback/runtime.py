"""Connects JAX devices to the receiver: transports, device ids, barrier, stop."""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from . import _jax_adapter as adapter
from . import settings
from .host_functions import HostFunction, Transforms, make_consumer
from .receiver import (PythonTransport, QueueStats, Receiver, Runtime,
                       TransportFactory, in_consumer_thread)

try:
  from .receiver import transport_native
except ImportError:  # not written yet, or the native library is absent
  transport_native = None


def native_available() -> bool:
  """Whether the native transport was built and loads."""
  return transport_native is not None and transport_native.available()


def available_transports() -> List[str]:
  """The transports this installation can use."""
  return ["python", "native"] if native_available() else ["python"]


def _make_transports() -> Dict[str, TransportFactory]:
  max_bytes = settings.queue_bytes()
  factories: Dict[str, TransportFactory] = {
      "python": functools.partial(PythonTransport, max_bytes)}
  if native_available():
    factories["native"] = functools.partial(
        transport_native.NativeTransport, max_bytes)
  return factories


@functools.lru_cache(maxsize=None)
def _devices_by_id() -> Dict[int, Any]:
  return {device.id: device for device in jax.devices()}


def device_by_key(device_key: int) -> Any:
  """The jax.Device whose id is `device_key`."""
  return _devices_by_id()[device_key]


def receiver() -> Receiver:
  """The running receiver, started on first use and after a stop."""
  return _runtime.receiver(_make_transports)


def register(function: HostFunction, transforms: Transforms) -> int:
  """The consumer id for `function` under `transforms`."""
  return _runtime.registry.register(
      (function, transforms),
      make_consumer(function, transforms, device_by_key))


def python_send(device_key: int, consumer_id: int,
                arrays: Sequence[np.ndarray]) -> None:
  """Run by JAX's Python callback on the device thread: enqueue a tap."""
  transport = receiver().transports["python"]
  transport.send(device_key, consumer_id, arrays)


def python_request(device_key: int, consumer_id: int,
                   arrays: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
  """Run by JAX's Python callback on the device thread: a call round trip."""
  transport = receiver().transports["python"]
  return transport.request(device_key, consumer_id, arrays)


def run_inline(function: HostFunction, transforms: Transforms,
               arrays: Sequence[np.ndarray], device: Any) -> Any:
  """Runs a host function in the caller's thread (inline mode)."""
  consumer = _runtime.registry.get(register(function, transforms))
  try:
    return consumer(arrays, device.id)
  except Exception as error:
    _runtime.errors.record(error)
    raise


def barrier_wait(logging_name: Optional[str] = None) -> None:
  """See `host_callback.barrier_wait`."""
  del logging_name  # Only used for logging by the original.
  if in_consumer_thread():
    raise RuntimeError(
        "host_callback.barrier_wait was called from inside a host callback "
        "function; it would wait for itself. Call it from the main program.")
  _runtime.check_usable()
  adapter.dispatch_tracker.wait_all()
  running = _runtime.running_receiver()
  if running is not None:
    running.wait_processed()
  _runtime.errors.raise_if_any()


def queue_statistics() -> Dict[Tuple[str, Any], QueueStats]:
  """Per-device queue statistics of the running receiver."""
  running = _runtime.running_receiver()
  if running is None:
    return {}
  return {(name, device_by_key(key)): stats
          for (name, key), stats in running.queue_stats().items()}


def stop_outfeed_receiver() -> None:
  """See `host_callback.stop_outfeed_receiver`."""
  if in_consumer_thread():
    raise RuntimeError(
        "host_callback.stop_outfeed_receiver was called from inside a host "
        "callback function; call it from the main program.")
  adapter.dispatch_tracker.wait_all()
  _runtime.stop()


def _drain_at_exit() -> None:
  try:
    _runtime.check_usable()
  except RuntimeError:
    return  # a forked child: nothing of ours to drain
  try:
    barrier_wait("at_exit")
  except Exception:  # pylint: disable=broad-except
    pass  # already logged when it happened
  _runtime.stop()


_runtime = Runtime(at_exit=_drain_at_exit)
# A cached executable may run after stop_outfeed_receiver(): restart first.
adapter.dispatch_tracker.before_dispatch = receiver
adapter.install_dispatch_tracker()
