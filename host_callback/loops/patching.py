"""The `record` blocks' hook: while one is open, `jax.lax.scan` and
`jax.lax.while_loop` are replaced by functions that instrument the
outermost loop a thread calls (nested ones, and those the instrumentation
makes, run as they are). The replaced functions, or what another library
had put there, are put back when the last block closes."""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Callable, Iterator, Optional

import jax

original_scan: Callable[..., Any] = jax.lax.scan
original_while: Callable[..., Any] = jax.lax.while_loop

# interceptor(run, *operands): instruments `run(*operands)`, the loop as
# the user called it.
Interceptor = Callable[..., Any]

_lock = threading.Lock()  # guards the fields below and jax.lax's two names
_state = threading.local()  # .depth: loops being run; .off: inside a walk
_before: dict = {}  # name -> what jax.lax held when the first block opened
_interceptor: Optional[Interceptor] = None


def underlying_scan() -> Callable[..., Any]:
  """The scan to run loops with: what jax.lax held before the blocks."""
  return _before.get("scan", original_scan)


def underlying_while() -> Callable[..., Any]:
  """The while_loop to run loops with, as `underlying_scan`."""
  return _before.get("while_loop", original_while)


@contextlib.contextmanager
def unintercepted() -> Iterator[None]:
  """No loop this thread calls is intercepted (while a function is walked:
  its loops are instrumented by the walk)."""
  old = getattr(_state, "off", False)
  _state.off = True
  try:
    yield
  finally:
    _state.off = old


@contextlib.contextmanager
def _outermost() -> Iterator[bool]:
  """Whether this is the thread's outermost loop call that may be
  intercepted."""
  depth = getattr(_state, "depth", 0)
  _state.depth = depth + 1
  try:
    yield depth == 0 and not getattr(_state, "off", False)
  finally:
    _state.depth = depth


def _patched_scan(f: Callable[..., Any], init: Any, xs: Any = None,
                  length: Optional[int] = None, reverse: bool = False,
                  unroll: Any = 1, _split_transpose: bool = False) -> Any:
  kwargs = dict(length=length, reverse=reverse, unroll=unroll,
                _split_transpose=_split_transpose)

  def run(init: Any, xs: Any) -> Any:
    return underlying_scan()(f, init, xs, **kwargs)
  with _outermost() as intercept:
    interceptor = _interceptor
    if intercept and interceptor is not None:
      return interceptor(run, init, xs)
    return run(init, xs)


def _patched_while(cond_fun: Callable[..., Any], body_fun: Callable[..., Any],
                   init_val: Any) -> Any:
  def run(init: Any) -> Any:
    return underlying_while()(cond_fun, body_fun, init)
  with _outermost() as intercept:
    interceptor = _interceptor
    if intercept and interceptor is not None:
      return interceptor(run, init_val)
    return run(init_val)


_PATCHES = {"scan": _patched_scan, "while_loop": _patched_while}
_ORIGINALS = {"scan": original_scan, "while_loop": original_while}


def install(interceptor: Interceptor) -> None:
  """Routes the outermost loops to `interceptor(run, *operands)`, where
  `run(*operands)` runs the loop as called."""
  global _interceptor
  with _lock:
    if _interceptor is None:
      for name, patch in _PATCHES.items():
        current = getattr(jax.lax, name)
        if current is not patch:
          _before[name] = current
        setattr(jax.lax, name, patch)
    _interceptor = interceptor


def uninstall() -> None:
  """Puts back what jax.lax held, unless another library replaced our
  functions meanwhile (then it warns, and leaves them)."""
  global _interceptor
  with _lock:
    if _interceptor is None:
      return
    _interceptor = None
    for name, patch in _PATCHES.items():
      if getattr(jax.lax, name) is patch:
        setattr(jax.lax, name, _before.get(name, _ORIGINALS[name]))
      else:
        try:
          warnings.warn(
              f"host_callback.loops: jax.lax.{name} was replaced by another "
              "library while a record() block was open; it is left as it "
              "is.", UserWarning, stacklevel=3)
        except Exception:  # noqa: BLE001  (python -W error)
          pass
    _before.clear()
