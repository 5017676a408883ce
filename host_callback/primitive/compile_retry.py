"""What to do when XLA refuses to compile a computation with our ops.

A tap must never break a program. XLA's CPU compiler has one known refusal
that only side effects expose: its library fusion (`dot-library-rewriter`,
YNNPACK) fuses a reduction, such as one that a tap sends, with its operand
when that operand has no other user, not seeing that the operand is the
entry computation's ROOT, and then fails removing the ROOT
(docs/xla_root_fusion.md). The lowering avoids it where it can: the end
mark takes the result as an operand (`ordering.kept_results`). Where it
cannot (automatically sharded code, or no native module), a refused
computation is compiled once more with the library's products but without
its reduction fusions, which XLA then accepts; a reduction's value may then
differ from the untapped program's within float32 reassociation. The first
attempt's error log (XLA writes it to file descriptor 2) is held back and
dropped when the retry succeeds.

XLA's GPU compiler refuses such a step too (`RET_CHECK ... IsDead()`,
64x64 on an H200 with jax 0.11.2, docs/gpu.md), where a second user of the
ROOT does not help but a ROOT behind an optimization barrier does: a
refused GPU computation is compiled once more with its results returned
through `stablehlo.optimization_barrier`, which there returned the untapped
program's values bitwise. Only a refused one: the barrier keeps XLA from
fusing the product's epilogue, which at 256x256 changed the values. There
XLA's error log of the first attempt is not held back (see `_GPU_RETRY`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

# XLA's debug option that lists the CPU library's fusions: its default in
# jax 0.10 to 0.12 less LIBRARY_FUSION_TYPE_REDUCE.
NO_REDUCTION_FUSION: Tuple[Tuple[str, str], ...] = (
    ("xla_cpu_experimental_ynn_fusion_type",
     "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)

# One holder of file descriptor 2 at a time: a second one would restore it
# to the first one's file.
_stderr_lock = threading.Lock()

# compile_with(options, result_barrier=False): compiles the computation with
# the (name, value) compiler options added to the jit's, and with its main
# function's results behind an optimization barrier where result_barrier.
Compile = Callable[..., Any]


# The platforms of JAX's GPU backends (a CUDA backend's is "gpu").
GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})


@dataclasses.dataclass(frozen=True)
class Retry:
  """How a refused computation is compiled once more: with `options`
  added, its results behind an optimization barrier where
  `result_barrier`; only after an error whose text holds `refusal` (any
  error where None); XLA's error log of the first attempt held back where
  `hold_stderr`. `how` is what the debug log says."""
  options: Tuple[Tuple[str, Any], ...]
  result_barrier: bool
  refusal: Optional[str]
  hold_stderr: bool
  how: str


_CPU_RETRY = Retry(NO_REDUCTION_FUSION, False, None, True,
                   "without the reduction fusions of XLA's CPU library")
# A GPU's first attempt keeps file descriptor 2: holding it would make
# compiles wait for one another, and a compile that waits for a running
# computation (autotuning, docs/gpu.md) would hold up a host function of
# that computation that compiles too. XLA's log of the refusal shows.
_GPU_RETRY = Retry((), True, "IsDead()", False,
                   "with its results behind an optimization barrier")
RETRIES: Dict[str, Retry] = {"cpu": _CPU_RETRY, **{
    platform: _GPU_RETRY for platform in GPU_PLATFORMS}}


def compile_ours(compile_with: Compile, *, platform: str,
                 root_kept: bool) -> Any:
  """Compiles a computation with our ops: `compile_with(())`, and, if XLA
  refuses it on a platform that RETRIES names, once more as that says; the
  first error stands if that fails too. `root_kept`: whether the lowering
  gave the ROOT the user that avoids the known refusal on CPU (then nothing
  is held back)."""
  retry = RETRIES.get(platform)
  if retry is None:
    return compile_with(())
  held: list = []
  try:
    with _holding_stderr(held, enabled=retry.hold_stderr and not root_kept):
      return compile_with(())
  except Exception as error:  # pylint: disable=broad-except
    if retry.refusal is not None and retry.refusal not in str(error):
      raise
    try:
      executable = compile_with(retry.options,
                                result_barrier=retry.result_barrier)
    except Exception:  # pylint: disable=broad-except
      _write_stderr(held)
      raise error from None
    logging.getLogger("host_callback").debug(
        "host_callback: XLA refused to compile a computation with taps or "
        "calls (%s); it was compiled again %s", _first_line(error), retry.how)
    return executable


def _first_line(error: BaseException) -> str:
  text = str(error)
  return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def _holding_stderr(held: list, *, enabled: bool) -> Iterator[None]:
  """Sends what is written to file descriptor 2 to a file while the block
  runs; writes it out after a block that returns, and leaves it in `held`
  after one that raises."""
  if not enabled:
    yield
    return
  with _stderr_lock, tempfile.TemporaryFile() as file:
    _flush_stderr()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
      yield
    except BaseException:
      held.append(_restore(saved, file))
      raise
    _write_stderr([_restore(saved, file)])


def _restore(saved: int, file: Any) -> bytes:
  """Points file descriptor 2 back at `saved`; what `file` got."""
  _flush_stderr()
  os.dup2(saved, 2)
  os.close(saved)
  file.seek(0)
  return file.read()


def _flush_stderr() -> None:
  if sys.stderr is not None:  # None without a console (pythonw)
    sys.stderr.flush()


def _write_stderr(held: list) -> None:
  for data in held:
    if data:
      os.write(2, data)
