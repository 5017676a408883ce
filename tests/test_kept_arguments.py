"""A host function that keeps what it was given keeps its own data: the
runtime refills a run's argument arrays for the next run only where nothing
holds them any more (see receiver/native/python_arguments.h)."""

import weakref

import jax
import jax.numpy as jnp
import numpy as np

import host_callback as hcb

_STEPS = 6


def _tap_each_step(tap):
  """Taps the step's value, [step, step + 0.5], at each step of a scan."""
  def body(carry, i):
    value = jnp.stack([i, i + 0.5])
    return carry + hcb.id_tap(tap, value)[0], None
  run = jax.jit(lambda: jax.lax.scan(body, 0.0, jnp.arange(
      _STEPS, dtype=jnp.float32))[0])
  run().block_until_ready()
  hcb.barrier_wait()


def _steps():
  return [[float(i), i + 0.5] for i in range(_STEPS)]


def test_a_kept_array_keeps_its_step(both_modes):
  kept = []
  _tap_each_step(lambda a, _: kept.append(a))
  assert [a.tolist() for a in kept] == _steps()


def test_a_kept_view_keeps_its_step(both_modes):
  kept = []
  _tap_each_step(lambda a, _: kept.append(a[:1]))
  assert [a.tolist() for a in kept] == [[step[0]] for step in _steps()]


def test_a_weakly_referenced_array_keeps_its_step(both_modes):
  """A weak reference does not count as holding the array, yet whoever
  holds it may read the array while alive: it is not refilled under it."""
  arrays, refs = [], []

  def tap(a, _):
    refs.append(weakref.ref(a))
    arrays.append(a)  # alive until the test reads it
  _tap_each_step(tap)
  assert [r().tolist() for r in refs] == _steps()


def test_an_array_changed_in_place_does_not_change_the_next_step(both_modes):
  """What a host function does to an array it does not keep (its values,
  shape, dtype or flags) is not seen by the next run."""
  seen = []

  def tap(a, _):
    seen.append((a.tolist(), a.shape, a.dtype.name, a.flags.writeable))
    step = len(seen) % 4
    if step == 0:
      a += 100
    elif step == 1:
      a.shape = (2, 1)
    elif step == 2:
      a.dtype = np.int32
    else:
      a.flags.writeable = False
  _tap_each_step(tap)
  assert seen == [(step, (2,), "float32", True) for step in _steps()]


def test_kept_arrays_of_several_arguments(both_modes):
  kept = []

  def body(carry, i):
    hcb.id_tap(lambda args, _: kept.append(args), (i, i * 2.0, i.astype(
        jnp.int16)))
    return carry, None
  jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(4, dtype=jnp.float32)))()
  hcb.barrier_wait()
  assert [tuple(np.asarray(a).item() for a in args) for args in kept] == [
      (float(i), i * 2.0, i) for i in range(4)]


def test_kept_loop_events_keep_their_steps(both_modes):
  """A loop event's step comes as an int and its value as an array, each
  run's own."""
  from host_callback import loops
  events = []

  def f(x):
    return jax.lax.scan(lambda c, _: (c + 1.0, None), x, None, length=5)[0]
  watched = loops.verbose(f, on_step=events.append,
                          select=lambda leaves: leaves[0] * 2)
  jax.block_until_ready(jax.jit(watched)(jnp.float32(0)))
  hcb.barrier_wait()
  assert [(e.step, float(e.value)) for e in events] == [
      (i, 2.0 * (i + 1)) for i in range(5)]  # the carry after the step
