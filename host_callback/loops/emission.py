"""The device side of a tap: what one loop or primitive sends, through
`host_callback.id_tap`, and the host function that turns it into events.

A tap sends the step, for a `while_loop` whether the step is real (under
`vmap` a finished lane runs on without being active), and the leaves of
what `select` returned. With `sample_every=k` the tap sits in a `lax.cond`
on `step % k == 0`, so unsampled steps neither select nor send.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import jax
import numpy as np

from .. import api
from .events import TapEvent
from .primitive_taps import PrimitiveTap


class Sink(Protocol):
  """Where a tap's events go: a `delivery.Observers`, or the router of the
  `record` blocks."""

  def wants(self, kind: str) -> bool: ...
  def deliver(self, event: TapEvent) -> None: ...
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


@dataclasses.dataclass(frozen=True, eq=False)
class _HostSide:
  """The host function of one tap site (compared by identity)."""
  path: str
  total: Optional[int]
  kind: str
  treedef: Any
  gated_by_activity: bool
  sink: Sink
  spec: Optional[PrimitiveTap] = None

  def __repr__(self) -> str:  # what a printed jaxpr shows
    return f"<host_callback.loops tap of {self.path} ({self.kind})>"

  def __call__(self, arg: tuple, transforms: tuple) -> None:
    batches = [params["batch_dims"] for name, params in transforms
               if name == "batch"]
    for lane in _lanes(tuple(arg), batches):
      step, rest = int(lane[0]), lane[1:]
      if self.gated_by_activity:
        if not rest[0]:
          continue  # a finished vmap lane of a while_loop
        rest = rest[1:]
      value = jax.tree_util.tree_unflatten(self.treedef, rest)
      event = TapEvent(self.path, step, value, self.total, self.kind)
      if self.spec is None:
        self.sink.deliver(event)
      else:
        self.sink.deliver_primitive(event, self.spec)


@dataclasses.dataclass(frozen=True)
class Emitter:
  """Makes the taps of one instrumented trace."""
  sink: Sink
  select: Optional[Callable[..., Any]] = None
  select_ys: Optional[Callable[..., Any]] = None
  sample_every: int = 1

  def _send(self, step: Any, sent: Callable[[], Any], *, path: str,
            total: Optional[int], kind: str,
            active: Optional[Callable[[], Any]] = None,
            spec: Optional[PrimitiveTap] = None, gated: bool = True) -> None:
    """Taps `sent()` (traced inside the gate) with `step`."""
    def tap() -> None:
      leaves, treedef = jax.tree_util.tree_flatten(sent())
      extra = () if active is None else (active(),)
      host = _HostSide(path, total, kind, treedef, active is not None,
                       self.sink, spec)
      api.id_tap(host, (step, *extra, *leaves))

    if gated and self.sample_every > 1:
      jax.lax.cond(step % self.sample_every == 0, tap, lambda: None)
    else:
      tap()

  def carry(self, path: str, step: Any, carry: tuple, total: Optional[int],
            active: Optional[Callable[[], Any]] = None) -> None:
    """After a loop step: its new carry (a tuple of leaves); `active()`, for
    a while_loop, whether the step is real."""
    if self.sink.wants("carry"):
      self._send(step, lambda: apply_select(self.select, carry, path),
                 path=path, total=total, kind="carry", active=active)

  def outputs(self, path: str, step: Any, ys: tuple,
              total: Optional[int]) -> None:
    """After a scan step: its outputs (a tuple of leaves)."""
    if ys and self.sink.wants("output"):
      self._send(step, lambda: apply_select(self.select_ys, ys, path),
                 path=path, total=total, kind="output")

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
               path=path, total=total, kind="carry", spec=spec,
               gated=in_loop)
