"""Faults: failing consumers, re-entrant consumers, interrupts, stop, exit, fork.

The faults of the receiver's consumers, its stop, exit and fork are tested in
the outfeed mode; re-entrant host functions and failing calls in both modes.
"""

import os
import signal
import threading
import time
import _thread

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import OUTFEED, barrier_report, run_python


def test_consumer_raising_every_nth_tap(outfeed_mode):
  received = []

  def tap(x, transforms):
    if int(x) % 10 == 3:
      raise ValueError(f"tap {int(x)} fails")
    received.append(int(x))

  @jax.jit
  def run(x):
    return jax.lax.scan(lambda c, _: (hcb.id_tap(tap, c) + 1, None), x, None,
                        length=100)[0]

  run(0)
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  assert received == [i for i in range(100) if i % 10 != 3]
  assert "ValueError: tap 93 fails" in str(info.value)
  assert str(info.value.__cause__) == "tap 93 fails"
  hcb.barrier_wait()  # raised once


def test_consumer_calling_barrier_wait_gets_a_clear_error(both_modes):
  errors = []

  def tap(x, transforms):
    try:
      hcb.barrier_wait()
    except RuntimeError as error:
      errors.append(str(error))

  jax.jit(lambda x: hcb.id_tap(tap, x))(1.)
  hcb.barrier_wait()
  assert len(errors) == 1 and "from inside a host callback" in errors[0]


def test_consumer_using_id_tap_and_jax(both_modes):
  inner = []

  def tap(x, transforms):
    doubled = jax.jit(lambda v: v * 2)(x)
    hcb.id_tap(lambda v, _: inner.append(float(v)), doubled)

  jax.jit(lambda x: hcb.id_tap(tap, x))(3.)
  hcb.barrier_wait()
  hcb.barrier_wait()  # the nested tap was enqueued by the first consumer
  assert inner == [6.0]


def test_keyboard_interrupt_during_barrier_wait_leaves_runtime_usable(
    outfeed_mode):
  # interrupt_main does nothing unless Python handles SIGINT.
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  started, release = threading.Event(), threading.Event()

  def slow(x, transforms):
    started.set()
    release.wait(10)  # until the barrier was interrupted, however late

  jax.jit(lambda x: hcb.id_tap(slow, x))(1.)
  started.wait(10)
  threading.Timer(0.1, _thread.interrupt_main).start()
  try:
    with pytest.raises(KeyboardInterrupt):
      hcb.barrier_wait()
  finally:
    release.set()
  received = []
  jax.jit(lambda x: hcb.id_tap(lambda v, _: received.append(float(v)), x))(2.)
  hcb.barrier_wait()
  assert received == [2.0]


def test_call_error_in_the_middle_of_a_long_scan_fails_fast(both_modes):
  def host(x):
    if int(x) == 500:
      raise ValueError("step 500")
    return x

  @jax.jit
  def run(x):
    return jax.lax.scan(
        lambda c, _: (hcb.call(host, c, result_shape=c) + 1, None), x, None,
        length=100_000)[0]

  start = time.monotonic()
  with pytest.raises(Exception, match="step 500"):
    jax.block_until_ready(run(0))
  assert time.monotonic() - start < 30
  barrier_report()  # the outfeed mode raises it again, as the original
  assert int(jax.jit(lambda x: hcb.call(lambda a: a + 1, x, result_shape=x))(1)) == 2


def test_stop_while_devices_wait_on_a_full_queue(transport):
  done = run_python("""
      import threading, time
      import jax, jax.numpy as jnp
      import host_callback as hcb
      received = []
      def slow(x, transforms):
        time.sleep(0.02)
        received.append(int(x[0]))
      @jax.jit
      def run(x):
        return jax.lax.scan(lambda c, _: (hcb.id_tap(slow, c) + 1, None), x,
                            None, length=40)[0]
      out = run(jnp.zeros(1_000_000, jnp.int32))  # 4 MB a tap, 16 MB bound
      time.sleep(0.1)
      hcb.stop_outfeed_receiver()
      jax.block_until_ready(out)
      print("received", received == list(range(40)))
      print("after restart", int(jax.jit(lambda x: hcb.call(
          lambda a: a + 1, x, result_shape=x))(1)))
      """, env={**OUTFEED, "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "16000000"},
      transport=transport)
  assert done.stdout.split("\n")[:2] == ["received True", "after restart 2"], done.stderr


def test_exit_with_many_taps_pending_delivers_all(transport):
  done = run_python("""
      import sys
      import jax
      import host_callback as hcb
      count = [0]
      def tap(x, transforms):
        count[0] += 1
        if count[0] == 10_000:
          print("all 10000 delivered", flush=True)
      jax.jit(lambda x: jax.lax.scan(
          lambda c, _: (hcb.id_tap(tap, c) + 1, None), x, None,
          length=10_000)[0])(0)
      print("exiting", flush=True)
      """, env=OUTFEED, transport=transport)
  assert done.returncode == 0, done.stderr
  assert "exiting" in done.stdout, done.stdout
  assert "all 10000 delivered" in done.stdout, done.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_after_receiver_started_fails_clearly_in_child(transport):
  done = run_python("""
      import os, sys
      import jax
      import host_callback as hcb
      jax.jit(lambda x: hcb.id_tap(lambda v, t: None, x))(1.)
      hcb.barrier_wait()
      pid = os.fork()
      if pid == 0:
        try:
          hcb.barrier_wait()
          print("child: no error")
        except RuntimeError as error:
          print("child:", "os.fork()" in str(error) and "'spawn'" in str(error))
        sys.stdout.flush()
        os._exit(0)
      os.waitpid(pid, 0)
      got = []
      jax.jit(lambda x: hcb.id_tap(lambda v, t: got.append(float(v)), x))(2.)
      hcb.barrier_wait()
      print("parent:", got)
      """, env=OUTFEED, transport=transport, timeout=60)
  assert done.stdout.split("\n")[:2] == ["child: True", "parent: [2.0]"], done.stderr
