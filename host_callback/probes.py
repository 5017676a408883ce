"""Whether JAX's CPU client has finished what was dispatched, without
visiting the program's arrays.

JAX's CPU client runs the single-device computations that one thread
dispatches to one device in dispatch order (JAX gives each thread its own
execution stream): one dispatched while an earlier one still runs or waits
(for its inputs, or for the one before it) waits for it, and
when none does, a cheap computation runs inline, before its dispatch
returns (`TfrtCpuExecutable::ExecuteHelper` in XLA's
`xla/pjrt/cpu/cpu_client.cc`, its "last enqueue event"; checked on jaxlib
0.10.2 and 0.12.0.1). Computations over several devices wait likewise for the
one over several devices before them, client-wide (its "last collective
launch event").

So a probe, a cheap computation dispatched on a device, whose output is
ready when its dispatch returns, shows that every single-device computation
that its thread dispatched before it on that device has finished, whatever
its inputs waited for; a probe over two local devices, once ready, shows it for the
computations over several devices. This costs a dispatch per device, and
one more, only once a computation of ours over several devices was lowered
(about 30 µs: such a computation always runs on the client's threads).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Iterable, List, Optional, Sequence

import jax
import numpy as np

from .devices import local_devices_by_number, zero_on

_multi_device_lowered = threading.Event()


def note_lowered(device_count: int) -> None:
  """The lowering of one of our computations, over `device_count` devices."""
  if device_count > 1:
    _multi_device_lowered.set()


@functools.lru_cache(maxsize=None)
def _probe() -> Any:
  return jax.jit(lambda on_device: on_device + 1)


@functools.lru_cache(maxsize=None)
def _zero_on(device_number: int) -> Optional[jax.Array]:
  """A zero committed to a local CPU device; None for another device:
  elsewhere computations are asynchronous, and nothing runs inline."""
  device = local_devices_by_number()[device_number]
  return zero_on(device) if device.platform == "cpu" else None


@functools.lru_cache(maxsize=None)
def _zeros_across_two_cpus() -> Optional[jax.Array]:
  """Zeros sharded over two local CPU devices, the fewest that make a
  computation over several devices (their order is client-wide)."""
  devices = list(local_devices_by_number().values())[:2]
  if len(devices) < 2 or any(d.platform != "cpu" for d in devices):
    return None
  mesh = jax.sharding.Mesh(np.array(devices), ("probe",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("probe"))
  return jax.device_put(np.zeros(len(devices), np.int32), sharding)


def dispatch(device_numbers: Iterable[int]) -> Optional[List[jax.Array]]:
  """Dispatches a probe on each of these local devices, and one over two
  devices once a computation of ours over several devices was lowered:
  when they are all ready, every computation dispatched so far by this
  thread to these devices has finished. None where that cannot be told
  (a device that is not a CPU)."""
  probe = _probe()
  dispatched = []
  for number in device_numbers:
    zero = _zero_on(number)
    if zero is None:
      return None
    dispatched.append(probe(zero))
  if _multi_device_lowered.is_set():
    zeros = _zeros_across_two_cpus()
    if zeros is not None:
      dispatched.append(probe(zeros))
  return dispatched


def finished(device_numbers: Iterable[int]) -> bool:
  """Whether every computation that this thread dispatched so far to these
  local devices has finished (False where that cannot be told)."""
  dispatched = dispatch(device_numbers)
  return dispatched is not None and all([p.is_ready() for p in dispatched])


def wait_for(dispatched: Sequence[jax.Array]) -> None:
  """Waits until every probe is ready: single-device ones that ran inline
  are at once; others when the computations before them have finished."""
  for probe in dispatched:
    try:
      probe.block_until_ready()
    except Exception:  # pylint: disable=broad-except
      pass  # an earlier computation failed: it has finished, as the probe has
