"""Every way old code imported jax.experimental.host_callback."""
import functools  # a comment that stays

from jax.experimental import host_callback as hcb  # the usual one
from jax.experimental import host_callback
from jax.experimental import (
    pjit,  # stays with pjit
    host_callback as foo,
)
from jax.experimental import host_callback as bar, pjit as pj
import jax.experimental.host_callback as baz
import os, jax.experimental.host_callback as qux
from jax.experimental.host_callback import id_tap, call as host_call
from jax.experimental.host_callback import (barrier_wait,
                                            id_print)  # aligned
from jax.experimental.host_callback import *

try:
  from jax.experimental import host_callback as maybe
except ImportError:  # very old JAX
  maybe = None


def tap(x):
  if x is None: import jax.experimental.host_callback as inline; return x
  y = hcb.id_tap(functools.partial(print, what="x"), x)
  z = foo.id_print(y, what="y")  # id_print keeps its kwargs
  host_call(print, z, result_shape=None)
  barrier_wait()
  return host_callback.id_tap(print, z, result=y, tap_with_device=True)
