"""Progress bars for jitted loops: jax-tqdm 0.4's `scan_tqdm`, `loop_tqdm`
and `PBar`, on `id_tap`, and `while_tqdm` for `lax.while_loop`.

    from host_callback.tqdm import scan_tqdm   # was: from jax_tqdm import ...

    @scan_tqdm(1000)
    def step(carry, i): ...
    jax.lax.scan(step, init, jnp.arange(1000))

Beyond jax-tqdm: under `pmap` and `shard_map` one bar per device (or one for
all with `per_device=False`), under `vmap` one bar for the batch, nested
loops reuse their inner bar, a bar closes when its computation fails, and a
tap costs a few microseconds, so `print_rate=1` is affordable. The bars are
drawn by the process that owns the device.

In a terminal the bars of a loop keep their rows (per-device bars in device
order) and end as one final row each; `id_print`, and `print` to a
terminal stdout, write above open bars, so that what a program prints
while they still draw stays intact; where output is not a terminal only
the final rows are written. A bar counts the steps completed, every
`print_rate` steps. A bar whose loop ends before its total closes at the
next `barrier_wait()` (at the latest at exit, or when the loop runs again)
and says "ended early"; a loop that runs past its total counts on, "past
its total of n".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import math
import threading
from typing import Any, Callable, Generic, Iterator, Optional, Tuple, TypeVar

import jax
import jax.numpy as jnp

from .. import api
from ..host import transport_policy
from .progress import Loop, Tap

__all__ = ["PBar", "loop_tqdm", "scan_tqdm", "while_tqdm"]

C = TypeVar("C")
_TQDM_TYPES = ("auto", "std", "notebook")
# Options that the bars set themselves; jax-tqdm drops them too.
_DROPPED = ("total", "mininterval", "maxinterval", "miniters")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PBar(Generic[C]):
  """A loop's carry with the id of its bar, as in jax-tqdm: under `vmap`,
  `PBar(id=jnp.arange(k), carry=...)` gives each batch element its own
  bar, at row `id`. Not needed for one bar per batch."""
  id: Any
  carry: C


def _tqdm_class(tqdm_type: str) -> Any:
  if tqdm_type not in _TQDM_TYPES:
    raise ValueError(
        'tqdm_type should be one of "auto", "std", or "notebook" '
        f'but got "{tqdm_type}"')
  module = importlib.import_module(f"tqdm.{tqdm_type}")
  if tqdm_type == "notebook" and module.IProgress is None:
    raise ImportError(
        f'host_callback.tqdm: tqdm_type="notebook" needs ipywidgets '
        f'({module.WARN_NOIPYW}). Install ipywidgets and run in Jupyter, or '
        'use tqdm_type="auto", which picks the notebook bar where it works.')
  return module.tqdm


def _checked_print_rate(n: int, print_rate: Optional[int]) -> int:
  """jax-tqdm's rule: every n/20 steps by default, at least 1."""
  if print_rate is None:
    return int(n / 20) if n > 20 else 1
  if print_rate < 1:
    raise ValueError(f"Print rate should be > 0 got {print_rate}")
  if print_rate > n:
    raise ValueError("Print rate should be less than the "
                     f"number of steps {n}, got {print_rate}")
  return print_rate


def _make_taps(total: Optional[int], ends_at_total: bool, print_rate: int,
               tqdm_type: str, per_device: bool, kwargs: dict) -> _Taps:
  tqdm_class = _tqdm_class(tqdm_type)
  default = (f"Running for {total:,} iterations" if total is not None
             else "Running")
  desc = kwargs.pop("desc", default)
  desc = kwargs.pop("message", desc)
  position = kwargs.pop("position", 0)
  for name in _DROPPED:
    kwargs.pop(name, None)
  on_screen = not issubclass(
      tqdm_class, importlib.import_module("tqdm.notebook").tqdm)
  return _Taps(Loop(total, ends_at_total, print_rate, tqdm_class, on_screen,
                    desc, position, per_device, kwargs))


def _devices_per_run() -> int:
  """How many devices run the code being traced, each its own part: those
  of the `pmap` or `shard_map` axes, else 1."""
  mesh = jax.sharding.get_abstract_mesh()
  return math.prod(mesh.shape[axis] for axis in mesh.manual_axes)


def _tap(tap: Tap, steps: Any, bar_id: Any) -> None:
  api.id_tap(tap, steps if bar_id is None else (steps, bar_id),
             tap_with_device=True)


_tracing = threading.local()  # .loops: the loops whose bodies are traced


@contextlib.contextmanager
def _tracing_body(loop: Loop) -> Iterator[None]:
  """While `loop`'s body is traced: loops traced in it are nested in it."""
  loops = _tracing.__dict__.setdefault("loops", [])
  loops.append(loop)
  try:
    yield
  finally:
    loops.pop()


def _taps_every_step(platform: str) -> bool:
  """Whether a bar lowered for `platform` taps every step and leaves the
  host to draw the steps it shows, rather than skip steps in a `lax.cond`:
  off CPU, on the native transport. There a native tap costs less than
  XLA's GPU conditional, which reads its predicate on the host each step;
  a Python tap costs more, and on CPU the conditional is cheap.

  Read at trace time, when `lax.platform_dependent` takes its branches: the
  transport setting is part of JAX's trace and jit cache keys. It asks the
  policy without registering the handlers, so that tracing registers no
  CUDA handlers; where XLA refuses them (and warns), the op lowers on the
  Python transport and the bar still taps every step, which is slower but
  draws the same."""
  return platform != "cpu" and transport_policy.for_platform(
      platform, register=False) == "native"


class _Taps:
  """The taps a decorated body makes, from its `Loop`: per step, one tap
  of a scalar, in at most one `lax.cond` (XLA's CPU loops slow down with a
  second one), or, where `_taps_every_step`, unconditional. The taps are
  ordered with the program's other taps and calls, and tied to none of its
  values."""

  def __init__(self, loop: Loop):
    self.loop = loop

  def _tap_function(self, kind: str) -> Tap:
    loops = _tracing.__dict__.get("loops", [])
    return Tap(self.loop, kind, _devices_per_run(),
               loops[-1] if loops else None, len(loops))

  def step(self, i: Any, bar_id: Any) -> None:
    """After step `i`, if the bar shows `i` (on some platforms after
    every step, see `_taps_every_step`)."""
    tap = self._tap_function("step")
    every = functools.partial(_tap, tap, i, bar_id)
    if self.loop.print_rate == 1:
      every()
      return

    def shown() -> None:
      jax.lax.cond(self.loop.shows(i), every, lambda: None)

    branches = {platform: every
                for platform in transport_policy.NATIVE_PLATFORMS
                if _taps_every_step(platform)}
    if branches:
      jax.lax.platform_dependent(default=shown, **branches)
    else:
      shown()

  def end(self, steps: Any, bar_id: Any) -> None:
    """After a loop of unknown length: `steps` done."""
    _tap(self._tap_function("final"), steps, bar_id)


def _unwrap(carry: Any) -> Tuple[Any, Any]:
  """(bar id or None, the user's carry)."""
  if isinstance(carry, PBar):
    return carry.id, carry.carry
  return None, carry


def _wrap(bar_id: Any, carry: Any) -> Any:
  return carry if bar_id is None else PBar(id=bar_id, carry=carry)


def scan_tqdm(n: int, print_rate: Optional[int] = None,
              tqdm_type: str = "auto", *, per_device: bool = True,
              **kwargs: Any) -> Callable[[Callable], Callable]:
  """A tqdm bar for a `lax.scan` of `n` steps, as jax-tqdm's `scan_tqdm`.

  Decorates the body `f(carry, x)`, where `x` is the iteration number (scan
  over `jnp.arange(n)`) or a tuple whose first element is. The carry may be
  a `PBar`. The bar closes after step `n - 1`; a scan shorter than `n`
  leaves it open until the next `barrier_wait()` (or exit, or the loop's
  next run), where it closes saying "ended early"; steps past `n` go to a
  second bar without a total, "past its total of n".

  Args:
    n: the number of steps.
    print_rate: move the bar every `print_rate` steps (default n/20).
    tqdm_type: "auto", "std" or "notebook": tqdm's module to take the bar
      from.
    per_device: under `pmap`/`shard_map`, one bar per device (each on its
      row, named by its device), or one for all devices when False.
    kwargs: for tqdm (`desc`, `position`, `leave`, `ncols`, ...; `message`
      is jax-tqdm's `desc`).
  """
  taps = _make_taps(n, True, _checked_print_rate(n, print_rate), tqdm_type,
                    per_device, kwargs)

  def decorator(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(carry: Any, x: Any) -> Any:
      i = x[0] if isinstance(x, tuple) else x
      bar_id, carry = _unwrap(carry)
      with _tracing_body(taps.loop):
        carry, y = func(carry, x)
      taps.step(i, bar_id)
      return _wrap(bar_id, carry), y
    return wrapper
  return decorator


def loop_tqdm(n: int, print_rate: Optional[int] = None,
              tqdm_type: str = "auto", *, per_device: bool = True,
              **kwargs: Any) -> Callable[[Callable], Callable]:
  """A tqdm bar for a `lax.fori_loop` of `n` steps, as jax-tqdm's
  `loop_tqdm`: decorates the body `f(i, val)`; `val` may be a `PBar`.
  Arguments as `scan_tqdm`'s."""
  taps = _make_taps(n, True, _checked_print_rate(n, print_rate), tqdm_type,
                    per_device, kwargs)

  def decorator(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(i: Any, val: Any) -> Any:
      bar_id, val = _unwrap(val)
      with _tracing_body(taps.loop):
        val = func(i, val)
      taps.step(i, bar_id)
      return _wrap(bar_id, val)
    return wrapper
  return decorator


def while_tqdm(total: Optional[int] = None, print_rate: int = 1,
               tqdm_type: str = "auto", *, per_device: bool = True,
               **kwargs: Any) -> Callable[[Callable, Callable, Any], Any]:
  """A `lax.while_loop` with a tqdm bar that counts its iterations.

      while_loop = while_tqdm(total=100)
      final = while_loop(cond_fun, body_fun, init_val)

  The bar shows `total` when given (a guess is fine: past it the bar
  shows the count alone, "past its total of n"; a loop that ends before it
  closes there, "ended early"), else the count alone, and closes when
  the loop ends. `init_val` may be a `PBar`. Other arguments as
  `scan_tqdm`'s; `print_rate` is 1 by default, as a tap costs a few
  microseconds.
  """
  if print_rate < 1:
    raise ValueError(f"Print rate should be > 0 got {print_rate}")
  taps = _make_taps(total, False, print_rate, tqdm_type, per_device, kwargs)

  def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    bar_id, init_val = _unwrap(init_val)

    def body(state: Tuple[Any, Any]) -> Tuple[Any, Any]:
      count, val = state
      with _tracing_body(taps.loop):
        val = body_fun(val)
      taps.step(count, bar_id)
      return count + 1, val

    count, val = jax.lax.while_loop(lambda state: cond_fun(state[1]), body,
                                    (jnp.int32(0), init_val))
    taps.end(count, bar_id)
    return _wrap(bar_id, val)
  return while_loop
