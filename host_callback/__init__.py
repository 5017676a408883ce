"""host_callback: `jax.experimental.host_callback` for current JAX.

    import host_callback as hcb
    hcb.id_print(x, what="x")        # inside jit, grad, vmap, scan, ...
    hcb.barrier_wait()
"""

from .api import (barrier_wait, call, id_print, id_tap, queue_statistics,
                  stop_outfeed_receiver)
from .compat import install
from .receiver import CallbackException

TapFunctionException = CallbackException

__all__ = [
    "CallbackException", "TapFunctionException", "barrier_wait", "call",
    "id_print", "id_tap", "install", "queue_statistics",
    "stop_outfeed_receiver",
]
