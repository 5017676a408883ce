"""Emits a tap or a call for the native transport: an XLA FFI custom call.

A tap becomes `host_callback_outfeed(token, *args) -> token`, a `call`
becomes `host_callback_call(token, *args) -> (token, *results)`; the token is
our ordering token, so XLA keeps them in program order on each device. The
handlers read the executing device from the FFI device ordinal, which on CPU
is the `jax.Device.id` of the device.
"""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

import jax
import numpy as np

from . import _jax_adapter as adapter
from .receiver import transport_native


@functools.lru_cache(maxsize=None)
def _register_targets() -> None:
  """Registers the FFI handlers with XLA for CPU, once per process."""
  for name, handler in transport_native.ffi_handlers().items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler),
                                platform="cpu")


def emit(ctx: Any, place: adapter.ExecutionPlace, args: Sequence[Any],
         arg_avals: Sequence[Any], result_avals: Sequence[Any], site: int,
         is_call: bool) -> List[Any]:
  """The custom call, on a fixed device or on each device of a shard_map."""
  _register_targets()
  # As for JAX's own callbacks (and so the Python transport): a computation
  # that taps has run when its dispatch returns, so that barrier_wait's
  # markers come after it on the device.
  adapter.run_to_completion_at_dispatch(ctx)
  token_aval = adapter.abstract_token()
  op_ctx = ctx.replace(avals_in=[token_aval, *arg_avals],
                       avals_out=[token_aval, *result_avals])
  target = (transport_native.CALL_TARGET if is_call
            else transport_native.OUTFEED_TARGET)
  op = jax.ffi.build_ffi_lowering_function(target, has_side_effect=True)(
      op_ctx, ctx.tokens_in.get(adapter.host_callback_effect), *args,
      site=np.int64(site))
  adapter.set_token_op_sharding(ctx, op, place, result_avals)
  token, *results = op.results
  adapter.thread_token(ctx, token)
  return list(results)
