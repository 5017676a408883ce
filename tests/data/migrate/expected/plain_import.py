"""`import jax.experimental.host_callback` also bound the name `jax`."""
import jax
import host_callback  # for the taps
import jax.numpy as jnp


@jax.jit
def f(x: jax.Array) -> jax.Array:
  host_callback.id_tap(print, x)
  return jnp.sin(x)


def wait():
  host_callback.barrier_wait("done")
