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

So a probe, a tiny computation without arguments dispatched on a device,
shows once it has finished that every single-device computation that its
thread dispatched before it on that device has finished, whatever its
inputs waited for; when none is pending, it runs inline and has finished
when its dispatch returns. A probe over two local devices shows it for the
computations over several devices. This costs a dispatch per device
(compiled once, a probe has no outputs and is dispatched without a jitted
call's argument handling), and one more once a computation of ours over
several devices was lowered, which goes through the client's threads: such
a computation always runs there (docs/benchmarks.md's idle barrier rows).

Probes are compiled outside any mesh the program set (`jax.set_mesh`),
whose devices would conflict with theirs.
"""

from __future__ import annotations

import functools
from typing import Any, FrozenSet, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_adapter as adapter
from ..host import host_side
from ..host.device_numbers import local_devices_by_number
from ..primitive import ordering

def _compiled_probe(sharding: jax.sharding.Sharding) -> Any:
  """A computation without arguments whose output has `sharding`: what runs
  it where the sharding says, cheaper to dispatch than a jitted call."""
  size = len(sharding.device_set)
  probe = jax.jit(lambda: jnp.zeros((size,), jnp.int32), out_shardings=sharding)
  with adapter.outside_the_program_mesh():
    return probe.lower().compile().runtime_executable()


@functools.lru_cache(maxsize=None)
def _probe_on(device_number: int, readable: bool = False) -> Optional[Any]:
  """The probe of a local CPU device; None for another device: elsewhere
  computations are asynchronous, and nothing runs inline.

  The barrier's probe has no outputs, which makes it the cheapest to
  dispatch (about a quarter less than with one); with neither
  arguments nor outputs, it runs on the default device, outside any mesh
  the caller set (which would place it on the mesh's devices). A
  `readable` one outputs an array, whose readiness can be read without
  waiting (its token's cannot)."""
  device = local_devices_by_number()[device_number]
  if device.platform != "cpu":
    return None
  if readable:
    return _compiled_probe(jax.sharding.SingleDeviceSharding(device))
  with adapter.outside_the_program_mesh(), jax.default_device(device):
    return jax.jit(lambda: ()).lower().compile().runtime_executable()


@functools.lru_cache(maxsize=None)
def _probe_across_two_cpus() -> Optional[Any]:
  """The probe over two local CPU devices, the fewest that make a
  computation over several devices (their order is client-wide)."""
  local = local_devices_by_number()
  devices = [local[number] for number in sorted(local)
             if local[number].platform == "cpu"][:2]
  if len(devices) < 2:
    return None
  mesh = jax.sharding.Mesh(np.array(devices), ("probe",))
  return _compiled_probe(jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("probe")))


@functools.lru_cache(maxsize=None)
def _probes(device_numbers: FrozenSet[int], readable: bool
            ) -> Tuple[Tuple[Any, ...], bool]:
  """The probes on these devices that `dispatch` dispatches, and whether
  they cover every device."""
  on_devices = [_probe_on(number, readable)
                for number in sorted(device_numbers)]
  chosen = [probe for probe in on_devices if probe is not None]
  return tuple(chosen), None not in on_devices


def cover(device_numbers: FrozenSet[int]) -> bool:
  """Whether the probes cover every one of these devices (each is a local
  CPU), as `dispatch` says."""
  return _probes(device_numbers, False)[1]


def dispatch(device_numbers: FrozenSet[int], readable: bool = False
             ) -> Tuple[List[Any], bool]:
  """Dispatches a probe on each local CPU device among these, and one over
  two CPU devices once a computation of ours over several devices was
  lowered: when they have all finished, every computation dispatched so
  far by this thread to those CPU devices has finished. Also returns
  whether that covers every device given (False when one is not a CPU:
  elsewhere computations are asynchronous, and nothing runs inline).
  `readable` probes output arrays (see `cpu_finished`)."""
  chosen, covered = _probes(device_numbers, readable)
  dispatched = [adapter.execute_without_arguments(probe) for probe in chosen]
  across = (_probe_across_two_cpus() if ordering.multi_device_lowered()
            else None)
  if across is not None:
    # Its dispatch waits for the launch of the computation over several
    # devices before it (client-wide, so any thread may dispatch it).
    dispatched.append(host_side.blocking(
        lambda: adapter.execute_without_arguments(across)))
  return dispatched, covered


def cpu_finished(device_numbers: FrozenSet[int]) -> bool:
  """Whether every computation that this thread dispatched so far to the
  CPU devices among these local devices has finished."""
  dispatched, _ = dispatch(device_numbers, readable=True)
  return all(
      array.is_ready() for results in dispatched
      for arrays in results.disassemble_into_single_device_arrays()
      for array in arrays)


def wait_for(dispatched: Sequence[Any]) -> None:
  """Waits until every probe has finished: single-device ones that ran
  inline have at once; others when the computations before them have
  finished (the client waits for those with their errors cleared, so a
  probe does not fail)."""
  for results in dispatched:
    token = results.consume_token()
    host_side.blocking(token.block_until_ready)
