"""Calling SciPy from jitted code with `call`, differentiable via `custom_jvp`.

JAX has no Airy function: `airy_ai` gets Ai(x) and its derivative Ai'(x) from
`scipy.special.airy` on the host, and its JVP rule uses Ai'(x). The gradient is
checked against finite differences, and Newton's method inside `jax.jit` finds
the first zero of Ai.   Run: python examples/scipy_call.py
"""

import jax

jax.config.update("jax_enable_x64", True)  # SciPy computes in float64

import jax.numpy as jnp  # noqa: E402
import scipy.special  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import host_callback as hcb  # noqa: E402


def ai_and_derivative(x):
  """Runs on the host: NumPy in, NumPy out."""
  ai, ai_prime, _, _ = scipy.special.airy(x)
  return ai, ai_prime


def _airy_on_host(x):
  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  return hcb.call(ai_and_derivative, x, result_shape=(shape, shape))


@jax.custom_jvp
def airy_ai(x):
  return _airy_on_host(x)[0]


@airy_ai.defjvp
def _airy_ai_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  ai, ai_prime = _airy_on_host(x)
  return ai, ai_prime * x_dot


@jax.jit
def first_zero(x):
  def newton_step(_, x):
    return x - airy_ai(x) / jax.grad(airy_ai)(x)
  return jax.lax.fori_loop(0, 10, newton_step, x)


if __name__ == "__main__":
  xs = jnp.linspace(-4.0, 2.0, 7)
  check_grads(airy_ai, (xs,), order=1, modes=("fwd", "rev"))  # raises if off
  grads = jax.vmap(jax.grad(airy_ai))(xs)  # one host call per element
  h = 1e-6
  numeric = (airy_ai(xs + h) - airy_ai(xs - h)) / (2 * h)
  print("max |grad - finite difference| = "
        f"{jnp.max(jnp.abs(grads - numeric)):.1e}")
  print(f"first zero of Ai: {first_zero(-2.0):.8f} (tabulated: -2.33810741)")
