"""`import jax.experimental.host_callback` also bound the name `jax`."""
import jax.experimental.host_callback  # for the taps
import jax.numpy as jnp


@jax.jit
def f(x: jax.Array) -> jax.Array:
  jax.experimental.host_callback.id_tap(print, x)
  return jnp.sin(x)


def wait():
  jax.experimental.host_callback.barrier_wait("done")
