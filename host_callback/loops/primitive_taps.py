"""Specs of primitive taps, which watch a primitive's outputs by its name:
`on`, and the two shorthands `watch_nan` and `print`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class PrimitiveTap:
  """Watches every equation of the primitive `prim_name` (the name
  `jax.make_jaxpr` shows; `primitives(f, *args)` lists them).

  Attributes:
    prim_name: the primitive's name, e.g. `"cholesky"`.
    select: reduces the outputs on the device (a tuple of the primitive's
      outputs, or the one output `output` names); the default sends them all.
      It may take the tap's `path` as a second argument.
    alert: a host predicate on the event's value: when truthy, a line
      `[tap] FAIL {path} {step}/{total}: {label}` goes to stderr.
    label: the alert line's text (default: `prim_name`).
    output: the index of the one output to watch, in the primitive's order
      (which may differ from the Python function's, as for `eigh`).
    once: alert (or print) only the first time, per `verbose` call or
      `record` block.
  """
  prim_name: str
  select: Optional[Callable[..., Any]] = None
  alert: Optional[Callable[[Any], Any]] = None
  label: Optional[str] = None
  output: Optional[int] = None
  once: bool = False
  _printer: bool = dataclasses.field(default=False, repr=False)


def on(prim_name: str, select: Optional[Callable[..., Any]] = None,
       alert: Optional[Callable[[Any], Any]] = None,
       label: Optional[str] = None, output: Optional[int] = None,
       once: bool = False) -> PrimitiveTap:
  """A tap on the outputs of every `prim_name` equation; see `PrimitiveTap`."""
  return PrimitiveTap(prim_name, select, alert, label, output, once)


def _all_finite(outputs: Any) -> Any:
  """True when every floating-point array in `outputs` (an array or a tuple
  of them) is finite; arrays of other dtypes are not checked."""
  arrays = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
  checks = [jnp.all(jnp.isfinite(a)) for a in arrays
            if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)]
  if not checks:
    return jnp.bool_(True)
  return jnp.all(jnp.stack(checks)) if len(checks) > 1 else checks[0]


def _not_ok(ok: Any) -> bool:
  return not ok


def watch_nan(prim_name: str, label: str = "NaN/Inf",
              output: Optional[int] = None, once: bool = False
              ) -> PrimitiveTap:
  """Alerts when an output of `prim_name` holds a NaN or an infinity: the
  device sends one bool per equation and step."""
  return on(prim_name, select=_all_finite, alert=_not_ok, label=label,
            output=output, once=once)


def _always(_: Any) -> bool:
  return True


def print(prim_name: str, output: Optional[int] = None,  # noqa: A001
          select: Optional[Callable[..., Any]] = None,
          label: Optional[str] = None, once: bool = False) -> PrimitiveTap:
  """Prints each value of `prim_name`'s outputs to stderr, one line each:
  `[tap] {path} {step}/{total}: {value}`, arrays shortened."""
  return PrimitiveTap(prim_name, select, _always, label, output, once,
                      _printer=True)
