"""The device side of a tap: what one loop or primitive sends, through
`host_callback.id_tap`, and the host function that turns it into events.

A tap sends the step, for a `while_loop` whether the step is real (under
`vmap` a finished lane runs on without being active), and the leaves of
what `select` returned. With `sample_every=k` the tap sits in a `lax.cond`
on `step % k == 0`, so unsampled steps neither select nor send.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import jax
import numpy as np

from .. import api
from .events import TapEvent, of_site
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


_ONE_LEAF = jax.tree_util.tree_structure(0)


def _value_builder(treedef: Any, first: int) -> Callable[[tuple], Any]:
  """Rebuilds `select`'s value from a tap's `(step, [active,] *leaves)`:
  one leaf as it is, a flat tuple as a tuple, any other tree by
  unflattening."""
  if treedef == _ONE_LEAF:
    return operator.itemgetter(first)
  if treedef == jax.tree_util.tree_structure((0,) * treedef.num_leaves):
    return operator.itemgetter(slice(first, None))
  return lambda sent: jax.tree_util.tree_unflatten(treedef, sent[first:])


class _HostSide:
  """The host function of one tap site (compared by identity): what does
  not change from step to step (the path, total, kind, how to rebuild the
  value, where events go) is fixed when the site is traced. It gets
  `(step, [active,] *leaves)`, `active` for a while_loop: whether the step
  is real (a finished `vmap` lane's is not, and makes no event)."""

  def __init__(self, path: str, total: Optional[int], kind: str,
               treedef: Any, gated_by_activity: bool,
               deliver: Callable[[TapEvent], None]) -> None:
    self._site = (path, total, kind)
    self._gated = gated_by_activity
    self._value = _value_builder(treedef, 2 if gated_by_activity else 1)
    self._deliver = deliver

  def __repr__(self) -> str:  # what a printed jaxpr shows
    path, _, kind = self._site
    return f"<host_callback.loops tap of {path} ({kind})>"

  def __call__(self, sent: tuple, transforms: tuple, device: Any = None
               ) -> None:
    if transforms:
      batches = [params["batch_dims"] for name, params in transforms
                 if name == "batch"]
      for lane in _lanes(tuple(sent), batches):
        self(lane, (), device)
    elif not self._gated or sent[1]:
      self._deliver(of_site(self._site, sent[0].item(), self._value(sent),
                            device))


@dataclasses.dataclass(frozen=True)
class Emitter:
  """Makes the taps of one instrumented trace."""
  sink: Sink
  select: Optional[Callable[..., Any]] = None
  select_ys: Optional[Callable[..., Any]] = None
  sample_every: int = 1

  def _send(self, step: Any, sent: Callable[[], Any],
            deliver: Callable[[TapEvent], None], *, path: str,
            total: Optional[int], kind: str,
            active: Optional[Callable[[], Any]] = None,
            gated: bool = True) -> None:
    """Taps `sent()` (traced inside the gate) with `step`; the host makes
    events and gives them to `deliver`."""
    def tap() -> None:
      leaves, treedef = jax.tree_util.tree_flatten(sent())
      extra = () if active is None else (active(),)
      host = _HostSide(path, total, kind, treedef, active is not None,
                       deliver)
      api.id_tap(host, (step, *extra, *leaves), tap_with_device=True)

    if gated and self.sample_every > 1:
      jax.lax.cond(step % self.sample_every == 0, tap, lambda: None)
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
