"""The ways of tapping and calling being compared: each is a factory that
takes a host function and gives the operation a scenario jits (host_callback's
and JAX's own callbacks), or a progress bar or a lens to put on a scan."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import host_callback as hcb
from host_callback import loops
from host_callback.tqdm import scan_tqdm


def noop(arg: Any = None, transforms: Any = None) -> None:
  """The host function of the tap rows, which does nothing: JAX's callbacks
  call it with the value, host_callback's taps with the value and the
  transforms; no `*args` or `**kwargs`, whose tuple and dict would cost
  each call allocations that no column needs."""
  del arg, transforms


def _on_step(event: Any) -> None:
  """A lens's callback as users write one: a function of the event (no
  `**kwargs`, whose dict would cost each event an allocation)."""
  del event


def sleep_1ms(*args, **kwargs) -> None:
  time.sleep(0.001)


def tap_hcb(func: Callable, copy: bool = True) -> Callable:
  """A tap of `func`, a function of (arg, transforms), as JAX's callbacks
  call the same function with the value alone."""
  return lambda x: hcb.id_tap(func, x, copy=copy)


def _tap_debug(func: Callable) -> Callable:
  def tap(x):
    jax.debug.callback(func, x)
    return x
  return tap


def tap_io(func: Callable) -> Callable:
  def tap(x):
    io_callback(lambda a: func(a), None, x, ordered=True)
    return x
  return tap


def first(tap: Callable) -> Callable:
  """`tap`, returning one element: no output copy of the tapped array."""
  return lambda x: tap(x).ravel()[0]


def tap_hcb_partitioned(func: Callable) -> Callable:
  return lambda x: hcb.id_tap(func, x, partitioned=True)


def tap_debug_partitioned(func: Callable) -> Callable:
  def tap(x):
    jax.debug.callback(func, x, partitioned=True)
    return x
  return tap


def first_of_rows(tap: Callable) -> Callable:
  """`tap`, returning the first element of each row of a value sharded by
  rows: no output copy, and nothing gathered."""
  return lambda x: tap(x)[:, 0, 0]


def call_hcb(func: Callable, copy: bool = True) -> Callable:
  return lambda x: hcb.call(func, x, result_shape=x, copy=copy)


def call_hcb_filling(func: Callable) -> Callable:
  """A `buffers=True` call of `func(a, out)`, which fills `out` in place."""
  return lambda x: hcb.call(func, x, result_shape=x, buffers=True)


def copy_into(a, out) -> None:
  """The identity as a host function that fills `out`."""
  np.copyto(out, a)


def buffer_callbacks() -> Dict[str, Callable]:
  """`jax.experimental.buffer_callback` filling its output, where the
  installed JAX has it."""
  try:
    from jax.experimental.buffer_callback import buffer_callback
  except ImportError:
    return {}

  def identity(func: Callable) -> Callable:
    del func
    fill = lambda ctx, out, a: copy_into(np.asarray(a), np.asarray(out))  # noqa: E731
    return lambda x: buffer_callback(
        fill, jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  return {"buffer_callback": identity}


def call_pure(func: Callable) -> Callable:
  return lambda x: jax.pure_callback(func, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _call_io(func: Callable) -> Callable:
  return lambda x: io_callback(func, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                               ordered=True)


def _nothing(func: Callable) -> Callable:
  del func
  return lambda x: x


def _plus_one(func: Callable) -> Callable:
  del func
  return lambda x: x + 1


TAPPERS = {"debug.callback": _tap_debug, "io_callback": tap_io}
CALLERS = {"pure_callback": call_pure, "io_callback": _call_io}
NOTHING = {"no callback": _nothing}
# The yardstick of the large-array rows: one pass over the same array.
YARDSTICK = {"jit(x+1)": _plus_one}


def _installed(module: str, name: str, rows: str) -> Optional[Any]:
  """`module` where it is installed; else None, with a note that the `rows`
  rows have no `name` column."""
  try:
    return importlib.import_module(module)
  except ImportError:
    print(f"note: {name} is not installed, so the {rows} rows have no {name} "
          f"column (the bench extra: pip install -e '.[bench]')",
          file=sys.stderr)
    return None


# --- Progress bars: `make(n, print_rate)` gives a scan body's decorator ------

def hcb_bar(n: int, print_rate: Optional[int]) -> Callable:
  return scan_tqdm(n, print_rate, file=open(os.devnull, "w"))


def no_bar(n: int, print_rate: Optional[int]) -> Callable:
  del n, print_rate
  return lambda body: body


@functools.lru_cache(maxsize=None)
def progress_baselines() -> Dict[str, Callable]:
  """jax-tqdm's bar where it is installed; else none, with a note."""
  jax_tqdm = _installed("jax_tqdm", "jax-tqdm", "progress-bar")
  if jax_tqdm is None:
    return {}
  return {"jax-tqdm": lambda n, print_rate: jax_tqdm.scan_tqdm(
      n, print_rate, file=open(os.devnull, "w"))}


# --- Watching loops: `make(f, sample_every)` gives `f` with a lens on it ----

def _scalar_select(leaves: tuple):
  """A scalar `select`: the mean of the carry's first leaf (the carry itself
  where it is a scalar)."""
  return jnp.mean(leaves[0])


def hcb_lens(f: Callable, sample_every: int) -> Callable:
  return loops.verbose(f, on_step=_on_step, select=_scalar_select,
                       sample_every=sample_every)


def no_lens(f: Callable, sample_every: int) -> Callable:
  del sample_every
  return f


@functools.lru_cache(maxsize=None)
def lens_baselines() -> Dict[str, Callable]:
  """jax-tap's `verbose` where it is installed; else none, with a note."""
  jaxtap = _installed("jaxtap", "jaxtap", "loop")
  if jaxtap is None:
    return {}
  return {"jaxtap": lambda f, sample_every: jaxtap.verbose(
      f, on_step=_on_step, select=_scalar_select, sample_every=sample_every)}
