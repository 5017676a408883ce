"""The device side of a tap: what one loop or primitive sends, through
`api.consumer_tap` (the package's tap for its own consumers: `id_tap`'s
primitive and order, without its user-facing layer), and the host
function that turns it into events.

A tap sends the step (for a `while_loop`, INACTIVE where the step is not
real: under `vmap` a finished lane runs on without being active), which
the host function gets as a Python int (`consumer_tap`'s `int_operands`:
no array to make and convert), then the leaves of what `select` returned,
each an operand of its own: the native runner makes each operand's array
itself, which costs less than slicing one packed array in Python. With
`sample_every=k` the tap sits in a `lax.cond` on `step % k == 0`, so
unsampled steps neither select nor send.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from typing import (Any, Callable, Dict, Iterator, Optional, Protocol,
                    Sequence)

import jax
import jax.numpy as jnp
import numpy as np

from .. import api
from ..host.device_numbers import device_by_number
from ..receiver.instances import instance_feed
from .delivery import callback_failed
from .events import TapEvent, site_events
from .primitive_taps import PrimitiveTap


class Sink(Protocol):
  """Where a tap's events go: a `delivery.Observers`, or the router of the
  `record` blocks."""

  def observer(self, kind: str) -> Optional[Callable[[TapEvent], None]]:
    """Where the events of `kind` go; None where no one hears them (then
    no tap is made)."""

  def deliver_primitive(self, event: TapEvent, spec: PrimitiveTap) -> None: ...


def takes_path(select: Callable[..., Any]) -> bool:
  """Whether `select` takes the tap's path as well: a parameter named
  `path`, or a second positional one."""
  try:
    parameters = inspect.signature(select).parameters.values()
  except (TypeError, ValueError):
    return False
  positional = [p for p in parameters if p.kind in (
      p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  named = any(p.name == "path" and p.kind != p.VAR_KEYWORD
              for p in parameters)
  return named or len(positional) >= 2


def apply_select(select: Optional[Callable[..., Any]], values: Any,
                 path: str) -> Any:
  if select is None:
    return values
  if not takes_path(select):
    return select(values)
  try:
    return select(values, path=path)
  except TypeError:
    return select(values, path)


def _lanes(leaves: tuple, batches: Sequence[tuple]) -> Iterator[tuple]:
  """The leaves of each `vmap` lane, outermost batch first (the last
  "batch" entry of `transforms` is the outermost `vmap`)."""
  if not batches:
    yield leaves
    return
  *inner, dims = batches
  size = next(leaf.shape[d] for leaf, d in zip(leaves, dims) if d is not None)
  for i in range(size):
    yield from _lanes(tuple(leaf if d is None else np.asarray(np.take(leaf, i, axis=d))
                            for leaf, d in zip(leaves, dims)), inner)


# The step sent for a while_loop step that is not real (a finished `vmap`
# lane runs on without being active): the host makes no event of it. Real
# steps are >= 0, and -1 outside loops (a primitive tap's).
INACTIVE = -2

_ONE_LEAF = jax.tree_util.tree_structure(0)


def _value_builder(treedef: Any) -> Callable[[Sequence[Any]], Any]:
  """Rebuilds `select`'s value from its leaves: one leaf as it is, a flat
  tuple as a tuple, any other tree by unflattening."""
  if treedef == _ONE_LEAF:
    return operator.itemgetter(0)
  if treedef == jax.tree_util.tree_structure((0,) * treedef.num_leaves):
    return tuple
  return functools.partial(jax.tree_util.tree_unflatten, treedef)


def host_side(path: str, total: Optional[int], kind: str, treedef: Any,
              deliver: Callable[[TapEvent], None]) -> Callable[..., None]:
  """The host function of one tap site, a new function for each (compared
  by identity): what does not change from step to step (the path, total,
  kind, how to rebuild the value, where events go, the devices) is fixed
  when the site is traced. It is a consumer (see `api.consumer_tap`),
  called as `consume(arrays, device_id)` for every event, with
  `transforms=` under `vmap`: the device comes as its number, with no
  keyword argument to build. `arrays` is `[step, *leaves]`, the step a
  Python int (an array where `vmap` batched it); a step of INACTIVE makes
  no event."""
  event = site_events(path, total, kind)
  devices: Dict[int, Any] = {}  # by number
  value_of = _value_builder(treedef)

  def device_of(number: int) -> Any:
    device = devices.get(number)
    if device is None:
      device = devices[number] = device_by_number(number)
    return device

  def emit(sent: Sequence[Any], device: Any) -> None:
    """The event of what one step (or one `vmap` lane) sent."""
    step = int(sent[0])
    if step != INACTIVE:
      deliver(event(step, value_of(sent[1:]), device))

  def lanes(arrays: Sequence[Any], device_id: int, transforms: tuple) -> None:
    """The events of each `vmap` lane."""
    batches = [params["batch_dims"] for name, params in transforms
               if name == "batch"]
    device = device_of(device_id)
    for lane in _lanes(tuple(arrays), batches):
      emit(lane, device)

  def consume(arrays: Sequence[Any], device_id: int,
              transforms: tuple = ()) -> None:
    if transforms:
      lanes(arrays, device_id, transforms)
    else:
      emit(arrays, device_of(device_id))

  # What a printed jaxpr and an error show.
  consume.__name__ = consume.__qualname__ = (
      f"host_callback.loops tap of {path} ({kind})")
  if treedef != _ONE_LEAF:
    return consume
  # The usual `select`, one leaf (a scalar loss): the native module makes
  # each event as `site_events` does and gives it to the callback, guarded
  # as `guarding` guards it (an observer that is not a guard guards
  # itself), with no Python frame of ours (`receiver/instances.py`:
  # `instance_feed`, which knows nothing of events: it makes an instance
  # of TapEvent of (path, step, value, total, kind, device) from a packet
  # of (step, value)); `consume` serves the rest (`vmap` lanes, a device's
  # first event, a step of -1 or INACTIVE).
  callback = getattr(deliver, "__wrapped__", deliver)
  return instance_feed(TapEvent, (path,), (total, kind), devices, callback,
                       callback_failed, consume)


def _error_context(name: str) -> Callable[[], str]:
  """What names a site's consumer in the error of a device that waited for
  it, as an `id_tap`'s is named."""
  return lambda: f"host_callback.id_tap: the tap function {name}"


@dataclasses.dataclass(frozen=True)
class Emitter:
  """Makes the taps of one instrumented trace."""
  sink: Sink
  select: Optional[Callable[..., Any]] = None
  select_ys: Optional[Callable[..., Any]] = None
  sample_every: int = 1
  partitioned: bool = False

  def _send(self, step: Any, sent: Callable[[], Any],
            deliver: Callable[[TapEvent], None], *, path: str,
            total: Optional[int], kind: str,
            active: Optional[Callable[[], Any]] = None,
            gated: bool = True) -> None:
    """Taps `sent()` (traced inside the gate) with `step`; the host makes
    events and gives them to `deliver`."""
    def tap() -> None:
      leaves, treedef = jax.tree_util.tree_flatten(sent())
      leaves = [jnp.asarray(leaf) for leaf in leaves]
      code = (step if active is None
              else jnp.where(active(), step, jnp.int32(INACTIVE)))
      consume = host_side(path, total, kind, treedef, deliver)
      # The step comes as a Python int. A partitioned tap sends each
      # device's shard of each leaf.
      api.consumer_tap(consume, [code, *leaves],
                       context=_error_context(consume.__name__),
                       int_operands=(0,), partitioned=self.partitioned)

    if gated and self.sample_every > 1:
      # Steps are >= 0 here: a plain remainder, no sign fix-up. The select
      # and the tap are all in the taken branch.
      jax.lax.cond(jax.lax.rem(step, jnp.int32(self.sample_every)) == 0,
                   tap, lambda: None)
    else:
      tap()

  def carry(self, path: str, step: Any, carry: tuple, total: Optional[int],
            active: Optional[Callable[[], Any]] = None) -> None:
    """After a loop step: its new carry (a tuple of leaves); `active()`, for
    a while_loop, whether the step is real."""
    observer = self.sink.observer("carry")
    if observer is not None:
      self._send(step, lambda: apply_select(self.select, carry, path),
                 observer, path=path, total=total, kind="carry", active=active)

  def outputs(self, path: str, step: Any, ys: tuple,
              total: Optional[int]) -> None:
    """After a scan step: its outputs (a tuple of leaves)."""
    observer = self.sink.observer("output")
    if ys and observer is not None:
      self._send(step, lambda: apply_select(self.select_ys, ys, path),
                 observer, path=path, total=total, kind="output")

  def primitive(self, path: str, step: Any, outputs: tuple,
                total: Optional[int], spec: PrimitiveTap,
                in_loop: bool) -> None:
    """After an equation of `spec.prim_name`: its outputs."""
    if spec.output is not None:
      if not 0 <= spec.output < len(outputs):
        raise IndexError(
            f"host_callback.loops: on({spec.prim_name!r}, output="
            f"{spec.output}): the primitive has {len(outputs)} output(s), so "
            f"use an index from 0 to {len(outputs) - 1}")
      watched: Any = outputs[spec.output]
    else:
      watched = outputs
    self._send(step, lambda: apply_select(spec.select, watched, path),
               functools.partial(self.sink.deliver_primitive, spec=spec),
               path=path, total=total, kind="carry", gated=in_loop)
