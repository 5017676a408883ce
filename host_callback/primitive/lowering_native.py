"""Emits a tap or a call for the native transport: an XLA FFI custom call.

A tap becomes `host_callback_outfeed(token, *args) -> token`, a synchronous
tap `host_callback_tap_sync(token, *args) -> token`, a `call`
`host_callback_call(token, *args) -> (token, *results)`; the token is
our ordering token, so XLA keeps them in program order on each device. The
handlers read the executing device from the FFI device ordinal, which on CPU
is the `jax.Device.id` of the device, and on CUDA the local GPU (its queue is
`devices.device_number`'s, for one process per host). On CUDA the handlers
are `native/ffi_cuda.cc`'s (copies into pinned memory on the stream).
"""

from __future__ import annotations

from typing import Any, List, Sequence

import jax
import numpy as np

from .. import _jax_adapter as adapter
from .lowering_kinds import Kind
from ..receiver import transport_native


_TARGETS = {Kind.TAP: transport_native.OUTFEED_TARGET,
            Kind.TAP_SYNC: transport_native.TAP_SYNC_TARGET,
            Kind.CALL: transport_native.CALL_TARGET}


def emit(ctx: Any, place: adapter.ExecutionPlace, kind: Kind,
         operands: Sequence[Any], operand_avals: Sequence[Any],
         result_avals: Sequence[Any], site: int) -> List[Any]:
  """The custom call that sends `operands`, on a fixed device or on each
  device of a shard_map; returns a call's results."""
  # As for JAX's own callbacks (and so the Python transport): a computation
  # that taps has run when its dispatch returns, so that barrier_wait's
  # markers come after it on the device.
  adapter.run_to_completion_at_dispatch(ctx)
  token_aval = adapter.abstract_token()
  op_ctx = ctx.replace(avals_in=[token_aval, *operand_avals],
                       avals_out=[token_aval, *result_avals])
  op = jax.ffi.build_ffi_lowering_function(
      _TARGETS[kind], has_side_effect=True)(
          op_ctx, ctx.tokens_in.get(adapter.host_callback_effect), *operands,
          site=np.int64(site))
  adapter.set_token_op_sharding(ctx, op, place, result_avals)
  token, *results = op.results
  adapter.thread_token(ctx, token)
  return list(results)
