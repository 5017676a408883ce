"""The `host_callback` primitive and its rules, in the order JAX applies them.

One primitive serves taps and calls; its lowering rule is
`lowering.lower`, registered at the end, and `ordering` owns the token that
keeps it in order. Its operands are the leaves sent to the
host (`num_args` of them) followed, for taps, by the leaves of `result=`;
a tap returns all its operands unchanged (identity), a call returns
`function.result_avals` (a `host_functions.CallKind`).
"""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

import jax
from jax.extend.core import Primitive

from .. import _jax_adapter as adapter
from . import compile_retry, compile_watch, eager, lowering, ordering
from .. import settings
from .._jax_adapter import ad, batching, mlir
from ..host import host_functions
from ..host.host_functions import CallKind, HostFunction, Transforms

host_callback_p = Primitive("host_callback")
host_callback_p.multiple_results = True
adapter.require_devices_during_lowering(host_callback_p)
# A HostFunction in a param must not outlive the jaxprs and executables that
# use it (see host_side.register) because a JAX cache keyed on params holds it.
for kind in host_functions.KINDS:
  adapter.hold_weakly_in_jax_caches(kind)


def bind(operands: Sequence[Any], *, function: HostFunction, num_args: int,
         device_index: int, transforms: Transforms = ()) -> List[Any]:
  return host_callback_p.bind(*operands, function=function, num_args=num_args,
                              device_index=device_index, transforms=transforms)


# --- impl: eager use, one compiled op per signature, unless inline --------

def _impl(*operands, function: HostFunction, num_args: int, device_index: int,
          transforms: Transforms):
  """Eager use (no jit) compiles nothing per host function. In the
  synchronous mode, with its arguments on one idle device, the host function
  runs once they are ready, on the calling thread, as a direct request
  would (`eager.run_eager`). Otherwise it goes through the receiver as
  jitted taps do, in the device's order, by an op compiled once per
  signature (`_eager_op`), the host function travelling as a ticket
  (`eager.eager_ticket`); a partitioned one on an array split over
  devices is compiled as JAX compiles a primitive, with the array's
  sharding, so that each device sends its shard. With the inline setting,
  it runs in the caller."""
  if settings.inline.value:
    arrays = [jax.numpy.asarray(x) for x in operands[:num_args]]
    device = next(iter(arrays[0].devices())) if arrays else jax.devices()[0]
    host_arrays = [_host_array(a) for a in arrays]
    result = eager.run_inline(function, transforms, host_arrays, device)
    if not isinstance(function, CallKind):
      return list(operands)
    return [jax.numpy.asarray(r) for r in result]
  if eager.is_eager_function(function) or (  # `_eager_op` under disable_jit
      function.partitioned and _split(operands)):  # sent shard by shard
    return adapter.apply_primitive(
        host_callback_p, *operands, function=function, num_args=num_args,
        device_index=device_index, transforms=transforms)
  device = _synchronous_device(operands[:num_args], device_index)
  if device is not None:
    result = eager.run_eager(function, transforms,
                               [_host_array(x) for x in operands[:num_args]],
                               device)
    if result is not NotImplemented:
      if not isinstance(function, CallKind):
        return list(operands)
      return [jax.device_put(r, device) for r in result]
  ticket = eager.eager_ticket(function, transforms)
  try:
    out = _eager_op(num_args, device_index,
                    eager.dispatcher_of(function))(ticket, *operands)
  except BaseException:
    eager.drop_ticket(ticket)
    raise
  return list(out) if isinstance(function, CallKind) else list(out[1:])


@functools.lru_cache(maxsize=None)
def _eager_op(num_args: int, device_index: int,
              dispatcher: HostFunction) -> Any:
  """The jitted op of eager taps or calls with this signature (JAX compiles
  it once per operand types and placement); it sends its first operand, the
  ticket, before the operands."""
  return jax.jit(lambda ticket, *operands: bind(
      [ticket, *operands], function=dispatcher, num_args=num_args + 1,
      device_index=device_index))


def _synchronous_device(args: Sequence[Any], device_index: int) -> Any:
  """The device of `args` when an eager op on them would be synchronous (the
  CPU default), so that its host function may run as soon as they are
  ready: all are arrays on that one device. Else None."""
  device = None
  for arg in args:
    if not isinstance(arg, jax.Array):
      return None
    devices = arg.devices()
    if len(devices) != 1 or (device is not None and device not in devices):
      return None
    device = next(iter(devices))
  if (device is None or device_index != 0 or
      settings.outfeed_mode(device.platform)):
    return None
  return device


def _split(operands: Sequence[Any]) -> bool:
  """Whether an operand is a `jax.Array` on several devices."""
  return any(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
             for x in operands)


def _host_array(array: jax.Array) -> Any:
  """The NumPy value the host function sees (PRNG keys as their key data)."""
  if jax.dtypes.issubdtype(array.dtype, jax.dtypes.prng_key):
    array = jax.random.key_data(array)
  return jax.device_get(array)


host_callback_p.def_impl(_impl)


# --- abstract eval: identity for taps, the result avals for calls --------

def _abstract_eval(*avals, function: HostFunction, **_):
  out = function.result_avals if isinstance(function, CallKind) else avals
  return list(out), {adapter.host_callback_effect}


host_callback_p.def_effectful_abstract_eval(_abstract_eval)


# --- jvp: tap the primals only; tangents pass through ---------------------

def _jvp(primals, tangents, *, function: HostFunction, **params):
  if isinstance(function, CallKind):
    raise NotImplementedError(
        "host_callback: differentiation rules are implemented only for "
        "id_tap, not for call. Wrap the call in jax.custom_vjp or "
        "jax.custom_jvp to give it a derivative.")
  primals_out = bind(primals, function=function, **params)
  return primals_out, list(tangents)


ad.primitive_jvps[host_callback_p] = _jvp


# --- transpose: a tap of linear values taps their cotangents -------------

_TRANSPOSE = ("transpose", ())


def _transpose(cotangents, *operands, function: HostFunction, num_args: int,
               device_index: int, transforms: Transforms):
  """As the original: a tap applied to linear values (e.g. tangents inside a
  custom_jvp rule) sends the cotangents of all its operands, with
  ("transpose", {}) appended to `transforms`, and passes them through."""
  if isinstance(function, CallKind):
    raise NotImplementedError("host_callback.call cannot be transposed")
  cotangents = [ad.instantiate_zeros(ct) for ct in cotangents]
  passed = bind(cotangents, function=function, num_args=num_args,
                device_index=device_index, transforms=transforms + (_TRANSPOSE,))
  return [ct if ad.is_undefined_primal(x) else None
          for ct, x in zip(passed, operands)]


ad.primitive_transposes[host_callback_p] = _transpose


# --- batching: one tap of the whole batch, recorded in `transforms` -------

def _batch(batched_operands, batch_dims, *, function: HostFunction,
           num_args: int, device_index: int, transforms: Transforms):
  if isinstance(function, CallKind):
    return _batch_call(batched_operands, batch_dims, function=function,
                       num_args=num_args, device_index=device_index,
                       transforms=transforms)
  arg_dims = tuple(batch_dims[:num_args])
  if any(d is not None for d in arg_dims):
    transforms += (("batch", (("batch_dims", arg_dims),)),)
  # else, as the original, whose `result=` did not go through the tap: a tap
  # whose sent values are not batched is not batched (only `result=` is).
  out = bind(batched_operands, function=function, num_args=num_args,
             device_index=device_index, transforms=transforms)
  return out, list(batch_dims)


def _batch_call(batched_operands, batch_dims, **params):
  """A call under vmap runs the host function once per element, in order."""
  size = next(x.shape[d] for x, d in zip(batched_operands, batch_dims)
              if d is not None)
  moved = [batching.bdim_at_front(x, d, size)
           for x, d in zip(batched_operands, batch_dims)]
  out = jax.lax.map(lambda xs: bind(xs, **params), moved)
  return out, [0] * len(out)


batching.primitive_batchers[host_callback_p] = _batch


# --- partial eval for jax.checkpoint: re-tap what the policy recomputes ----

def _partial_eval_custom(saveable, unknowns_in, instantiated_in, eqn):
  """A tap of known values runs in the forward pass and, when the policy
  recomputes its outputs (`jax.checkpoint`'s default, or `dots_saveable`),
  again where the backward pass recomputes them, as the original did; when
  the policy saves them (`everything_saveable`), only once. A tap of unknown
  values is staged."""
  outs = len(eqn.outvars)
  known = not any(unknowns_in)
  if known and adapter.remat_saves(saveable, eqn):
    return eqn, None, [False] * outs, [False] * outs, []
  # Inputs the staged equation reads must be saved as residuals.
  residuals = [x for x, inst in zip(eqn.invars, instantiated_in)
               if not inst and not isinstance(x, jax.extend.core.Literal)]
  known_eqn = eqn if known else None
  return known_eqn, eqn, [not known] * outs, [True] * outs, residuals


adapter.register_partial_eval_custom_rule(host_callback_p, _partial_eval_custom)


# Every patch of JAX's internals (_jax_adapter.PATCHES): the ordering
# token's top-level scope, taps in a batched while predicate, taps that stay
# in loops under grad, compiling again what XLA refused, the watchdog of a
# compile that a host function starts on a GPU.
adapter.install_patches(ordering.scoped, ordering.needs_scope,
                        compile_retry.compile_ours, compile_watch.watching)


# --- lowering: where the op runs, then the transport's op (lowering.py) ---

mlir.register_lowering(host_callback_p, functools.partial(lowering.lower,
                                                          bind=bind),
                       cacheable=False)
