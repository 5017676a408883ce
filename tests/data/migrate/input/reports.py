"""Old uses that the codemod cannot fix, each reported."""
import os
from unittest import mock

import jax
from jax.experimental import host_callback as hcb
from jax.experimental.host_callback import id_tap as tap, _deprecated_id_tap

os.environ["JAX_HOST_CALLBACK_INLINE"] = "1"  # supported: not reported
jax.config.update("jax_host_callback_legacy", False)
jax.config.update("jax_host_callback_ad_transforms", True)
jax.config.update("jax_host_callback_outfeed", True)  # supported


def f(x, kwargs):
  hcb.id_tap(print, x, what="x", result=x)
  tap(print, x, nr=1, tap_with_device=True, device_index=0)
  tap(print, x, **kwargs)
  hcb.id_print(x, what="x")  # id_print's keywords are printed: fine
  hcb.call(print, x, callback_flavor=hcb.CallbackFlavor.IO_CALLBACK)
  hcb._initialize_outfeed_receiver(max_callback_queue_size_bytes=1 << 20)
  with mock.patch("jax.experimental.host_callback.id_tap"):
    pass
  return jax.experimental.host_callback.barrier_wait()
