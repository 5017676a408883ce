"""Here only the module's own uses read `jax`: no `import jax` is added."""
import jax.experimental.host_callback
import numpy as np


def show(x):
  return jax.experimental.host_callback.id_print(np.asarray(x))
