"""The primitive's parameters: one frozen class per kind of host function
(host_callback/host/host_functions.py), interned by callable and fields,
hashed by identity, each with its own consumer."""

import dataclasses
import gc
import weakref

import jax
import numpy as np
import pytest

from host_callback.host import host_functions
from host_callback.host.host_functions import (
    BuffersCallParams, CallKind, CallParams, ConsumerCallParams,
    ConsumerTapParams, HostFunction, TapParams, interned, make_consumer)

ONE = jax.tree_util.tree_structure(0)
AVALS = (jax.core.ShapedArray((2,), np.float32),)


def _no_device(number):
  del number


def _tap(arg, transforms):
  del arg, transforms


def _subclasses(kind):
  for sub in kind.__subclasses__():
    yield sub
    yield from _subclasses(sub)


def test_every_kind_that_is_made_is_held_weakly_by_jax_caches():
  """KINDS (which primitive.py hands to JAX's weak caches) names every
  class of parameters."""
  assert {kind for kind in _subclasses(HostFunction)
          if kind.__name__.endswith("Params")} == set(host_functions.KINDS)


def test_equal_callables_and_fields_give_one_object_held_weakly():
  def make(kind=TapParams, **fields):
    return interned(kind(func=_tap, arg_treedef=ONE, **fields))
  first = make()
  assert make() is first
  assert make(with_device=True) is not first
  call = make(CallParams, result_treedef=ONE, result_avals=AVALS)
  assert call is not first and isinstance(call, CallKind)
  assert first != TapParams(func=_tap, arg_treedef=ONE)  # by identity
  ref = weakref.ref(first)
  del first
  gc.collect()
  assert ref() is None


def test_parameters_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    TapParams(func=_tap, arg_treedef=ONE).copy = False


def test_each_kind_has_its_consumer():
  """A consumer kind's func is its consumer; a tap's consumer calls it
  with the transforms; a call's checks its results."""
  def context():
    return ""
  consume = ConsumerTapParams(func=_tap, context=context)
  assert make_consumer(consume, (), _no_device) is _tap
  seen = []
  tap = TapParams(func=lambda arg, transforms: seen.append((arg, transforms)),
                  arg_treedef=ONE)
  make_consumer(tap, (("batch", (("batch_dims", (0,)),)),), _no_device)(
      [np.float32(1)], 0)
  assert seen == [(np.float32(1), (("batch", {"batch_dims": (0,)}),))]
  call = CallParams(func=lambda a: a + 1, arg_treedef=ONE,
                    result_treedef=ONE, result_avals=AVALS)
  np.testing.assert_array_equal(
      make_consumer(call, (), _no_device)([np.zeros(2, np.float32)], 0)[0], [1, 1])
  buffers = BuffersCallParams(func=lambda a: np.ones(2, np.float32),
                              arg_treedef=ONE, result_treedef=ONE,
                              result_avals=AVALS, copy=False)
  np.testing.assert_array_equal(
      make_consumer(buffers, (), _no_device)([np.zeros(2, np.float32)], 0)[0],
      [1, 1])
  eager_call = ConsumerCallParams(func=_tap, context=context,
                                  result_avals=AVALS)
  assert make_consumer(eager_call, (), _no_device) is _tap
  with pytest.raises(TypeError, match="no consumer for HostFunction"):
    make_consumer(HostFunction(func=_tap), (), _no_device)
