"""Here only the module's own uses read `jax`: no `import jax` is added."""
import host_callback
import numpy as np


def show(x):
  return host_callback.id_print(np.asarray(x))
