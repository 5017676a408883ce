"""host_callback.loops when the program is stuck or fails elsewhere: a loop
whose device waits in a host function has reported its steps so far (the
outfeed mode delivers them while the device waits), and another host
function's error does not lose or reorder a loop's events."""

import threading

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
import host_callback.loops as tap
from helpers import (barrier_report, fails_when_synchronous, synchronous,
                     wait_until)


@pytest.mark.usefixtures("outfeed_mode")
def test_a_stuck_loop_has_reported_its_last_step():
  """Step 5 makes a call that returns only once the test has seen step 4's
  event: the events come while the device waits."""
  release = threading.Event()

  def wait_for_release(x):
    if not release.wait(60):
      raise TimeoutError("the test never saw step 4's event")
    return x

  def body(state):
    i, x = state
    x = jax.lax.cond(i == 5, lambda v: hcb.call(wait_for_release, v,
                                                result_shape=v),
                     lambda v: v, x)
    return i + 1, x + 1.0

  def solve(x):  # unmodified: a while_loop of 8 steps
    return jax.lax.while_loop(lambda s: s[0] < 8, body, (0, x))[1]

  g, rec = tap.record(jax.jit(solve), select=lambda leaves: leaves[1])
  results = []
  worker = threading.Thread(target=lambda: results.append(
      jax.block_until_ready(g(jnp.float32(0)))))
  worker.start()
  try:
    assert wait_until(lambda: any(e.step == 4 for e in rec.events))
    # The device is stuck in step 5's call: no later step has reported.
    assert [(e.step, float(e.value)) for e in rec.events] == [
        (s, s + 1.0) for s in range(5)]
  finally:
    release.set()
    worker.join(60)
  hcb.barrier_wait()
  assert float(results[0]) == 8.0
  assert [e.step for e in rec.events] == list(range(8))


def _fail_on_three(x, transforms):
  del transforms
  if x == 3.0:
    raise ValueError("three")


@pytest.mark.usefixtures("both_modes")
def test_events_survive_another_host_function_s_error():
  def run(x):  # unmodified: its own tap fails at step 2
    def body(c, _):
      c = c + 1.0
      hcb.id_tap(_fail_on_three, c)
      return c, None
    return jax.lax.scan(body, x, None, length=5)[0]

  g, rec = tap.record(jax.jit(run), select=lambda leaves: leaves[0])
  with fails_when_synchronous("three"):
    g(jnp.float32(0))
  error = barrier_report()
  # The synchronous mode: the computation failed at step 2's tap, before
  # step 2's event; the outfeed mode: every step ran and reported.
  steps = 2 if synchronous() else 5
  assert [(e.step, float(e.value)) for e in rec.events] == [
      (s, s + 1.0) for s in range(steps)]
  if error is not None:
    assert isinstance(error, hcb.CallbackException)
    assert "three" in str(error.__cause__ or error)
