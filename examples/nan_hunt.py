"""A NaN hunt in a loop left as it is: `host_callback.loops.record` watches
each step of a gradient descent that diverges, an alert names the first step
whose carry is not finite, and the recorder shows the steps that led there.

    python examples/nan_hunt.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import host_callback.loops as tap


def descend(w, learning_rate, steps):
  """Library code, unmodified: gradient descent on w**4."""
  grad = jax.grad(lambda w: w ** 4)
  step = lambda w, _: (w - learning_rate * grad(w), None)  # noqa: E731
  return jax.lax.scan(step, w, None, length=steps)[0]


def not_finite(event: tap.TapEvent):
  """The alert: a message for a step whose carry is NaN or infinite."""
  return not np.isfinite(event.value) and f"w = {float(event.value)}"


def main() -> None:
  with tap.record(select=lambda leaves: leaves[0], alert=not_finite,
                  alert_once=True) as rec:
    w = jax.jit(descend, static_argnums=2)(jnp.float32(1.0), 0.6, 20)
  print(f"result: w = {float(w)}")
  first = next(e for e in rec.events if not np.isfinite(e.value))
  print(f"first non-finite carry: {first.path}, step {first.step} of "
        f"{first.total}")
  for event in rec.events[max(first.step - 3, 0):first.step + 1]:
    print(f"  step {event.step}: w = {float(event.value):.6g}")


if __name__ == "__main__":
  main()
