"""Errors: exceptions in tap functions, barrier_wait's report, bad arguments.

Every test here runs in the outfeed and in the synchronous mode. In the
synchronous mode a tap function that raises fails the computation that ran
it (`fails_when_synchronous`), and that is the only report; in the outfeed
mode `barrier_wait` reports it (`barrier_report`).
"""

import functools
import inspect
import io
import logging
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import host_callback as hcb
from helpers import (OUTFEED, Recorder, barrier_report, cpu_devices,
                     fails_when_synchronous, run_python, synchronous)

pytestmark = pytest.mark.usefixtures("both_modes")


def print_x(x):
  print(x)


class UserError(Exception):
  pass


def raise_user_error(arg, transforms):
  raise UserError(f"user message {int(arg)}")


# --- exceptions in tap functions ---------------------------------------------


def test_exception_in_tap_later_taps_delivered_and_barrier_raises():
  rec = Recorder()

  def f(x):
    x = hcb.id_tap(rec, x)
    x = hcb.id_tap(raise_user_error, x + 1)
    return hcb.id_tap(rec, x + 1)

  with fails_when_synchronous("user message 2"):
    assert int(jax.jit(f)(1)) == 3
  report = barrier_report()
  # The synchronous mode stops the computation at the tap that raised.
  assert [int(v) for v in rec.args] == ([1] if synchronous() else [1, 3])
  if report is not None:
    message = str(report)
    assert message.startswith(
        "There were exceptions during callback processing. Last one was: "
        "Traceback (most recent call last):")
    assert "in raise_user_error" in message  # the user's frame
    assert message.rstrip().endswith("UserError: user message 2")
    assert isinstance(report.__cause__, UserError)
    assert str(report.__cause__) == "user message 2"
  # The later computations run normally, and the error is reported once.
  with fails_when_synchronous("user message 11"):
    assert int(jax.jit(f)(10)) == 12
  barrier_report()
  hcb.barrier_wait()


def test_second_barrier_does_not_raise_again():
  with fails_when_synchronous("user message 1"):
    jax.jit(lambda x: hcb.id_tap(raise_user_error, x))(1)
  barrier_report()
  hcb.barrier_wait()
  hcb.barrier_wait()


def test_barrier_reports_the_last_exception():
  f = jax.jit(lambda x: hcb.id_tap(raise_user_error, x))
  for i in range(3):
    with fails_when_synchronous(f"user message {i}"):
      f(i)
  report = barrier_report()
  if report is not None:
    assert str(report.__cause__) == "user message 2"


def test_exception_chains_the_original_object():
  raised = []

  def tap(arg, transforms):
    error = KeyError("the original")
    raised.append(error)
    raise error

  with fails_when_synchronous("the original"):
    jax.jit(lambda x: hcb.id_tap(tap, x))(1.)
  report = barrier_report()
  if report is not None:
    assert report.__cause__ is raised[0]
    assert "KeyError: 'the original'" in str(report)


def test_exception_in_eager_tap():
  rec = Recorder()
  with fails_when_synchronous("user message 5"):
    hcb.id_tap(raise_user_error, jnp.int32(5))
  hcb.id_tap(rec, jnp.int32(6))
  report = barrier_report()
  if report is not None:
    assert str(report.__cause__) == "user message 5"
  assert [int(v) for v in rec.args] == [6]


def test_exception_in_loop_does_not_stop_later_iterations():
  rec = Recorder()

  def tap(arg, transforms):
    rec(arg, transforms)
    if int(arg) == 1:
      raise UserError("at 1")

  with fails_when_synchronous("at 1"):
    jax.jit(lambda: lax.fori_loop(0, 4, lambda i, c: c + hcb.id_tap(tap, i),
                                  0))()
  barrier_report()
  # The synchronous mode stops the computation at the tap that raised.
  assert [int(v) for v in rec.args] == ([0, 1] if synchronous() else
                                        [0, 1, 2, 3])


def test_exception_is_logged_with_traceback_when_the_barrier_reports_it(
    caplog):
  """In the outfeed mode a tap's error waits for the barrier: it is logged
  at once. In the synchronous mode the computation fails with it, and
  nothing is postponed: no ERROR log (the traceback is in the raised
  error)."""
  with caplog.at_level(logging.ERROR):
    with fails_when_synchronous("user message 7"):
      jax.jit(lambda x: hcb.id_tap(raise_user_error, x))(7)
    barrier_report()
  text = "\n".join(record.getMessage() for record in caplog.records)
  if synchronous():
    assert text == ""
    return
  assert text.startswith("Postponing exception raised in callback function: "
                         "Traceback (most recent call last):")
  assert "UserError: user message 7" in text


def test_a_failed_call_is_not_logged_as_postponed(caplog):
  def fail(x):
    raise UserError("no result")

  with caplog.at_level(logging.ERROR):
    with pytest.raises(jax.errors.JaxRuntimeError, match="no result"):
      jax.block_until_ready(
          jax.jit(lambda x: hcb.call(fail, x, result_shape=x))(1.0))
    if not synchronous():  # the outfeed mode raises it at the barrier too
      with pytest.raises(hcb.CallbackException, match="no result"):
        hcb.barrier_wait()
  assert "Postponing" not in caplog.text


@pytest.mark.parametrize("argument", [lambda k: k, jnp.int32],
                         ids=["python-int", "jax-array"])
@pytest.mark.parametrize("op", ["call", "tap"])
def test_what_a_failing_host_function_raises_to_the_caller(op, argument):
  """What the user guide's "Errors" section says: the caller of a jitted
  step whose host function raises gets `jax.errors.JaxRuntimeError` from a
  call that JAX dispatches in Python (a first call, and the calls after a
  first call that failed), and a `ValueError` with the same message from
  one that JAX's C++ dispatch runs (a later call with the argument types
  of a call that succeeded), with arrays or Python numbers, as for
  `jax.pure_callback`. A tap's error reaches the caller in the synchronous
  mode only. Off CPU, where the computation runs after its dispatch, the
  error comes when the result is awaited, always a JaxRuntimeError (on the
  Python transport JAX's GPU callbacks raise our CallError, a subclass, as
  it is)."""
  on_cpu = jax.default_backend() == "cpu"
  if op == "tap" and not synchronous():
    pytest.skip("the outfeed mode does not wait for taps")

  def odd_fails(x, *transforms):
    if int(x) % 2:
      raise UserError(f"failed at {int(x)}")
    return x

  host = {"call": lambda x: hcb.call(odd_fails, x, result_shape=x),
          "tap": lambda x: hcb.id_tap(odd_fails, x)}[op]
  # Steps that fail from their first call, and steps that succeed first.
  for ks in ((1, 3), (0, 5, 7)):
    step = jax.jit(lambda x: host(x) + 1)
    for k in ks:
      if k == 0:
        assert int(step(argument(k))) == 1
        continue
      raised = (ValueError if ks[0] == 0 and on_cpu
                else jax.errors.JaxRuntimeError)
      with pytest.raises(raised, match=f"UserError: failed at {k}") as info:
        jax.block_until_ready(step(argument(k)))
      if on_cpu:
        assert type(info.value) is raised  # pylint: disable=unidiomatic-typecheck
        assert str(info.value).startswith("INTERNAL: ")
    if not synchronous():
      with pytest.raises(hcb.CallbackException, match=f"failed at {k}"):
        hcb.barrier_wait()
  for k in (9, 11):  # eager use
    with pytest.raises(jax.errors.JaxRuntimeError, match=f"failed at {k}"):
      jax.block_until_ready(host(argument(k)))
  barrier_report()


def test_public_names():
  for name in ("id_tap", "id_print", "call", "barrier_wait",
               "stop_outfeed_receiver", "CallbackException",
               "TapFunctionException"):
    assert hasattr(hcb, name), name
  from host_callback import (CallbackException, TapFunctionException,  # noqa: F401
                             barrier_wait, call, id_print, id_tap,
                             stop_outfeed_receiver)


def test_tap_function_exception_alias():
  assert hcb.TapFunctionException is hcb.CallbackException
  assert issubclass(hcb.CallbackException, Exception)
  with fails_when_synchronous("user message 1"):
    jax.jit(lambda x: hcb.id_tap(raise_user_error, x))(1)
  assert isinstance(barrier_report(), (hcb.TapFunctionException, type(None)))


def test_barrier_wait_inside_tap_raises_runtime_error():
  rec = Recorder()
  caught = []

  def tap(arg, transforms):
    try:
      hcb.barrier_wait()
    except RuntimeError as error:
      caught.append(error)
      raise

  with fails_when_synchronous("barrier_wait"):
    jax.jit(lambda x: hcb.id_tap(rec, hcb.id_tap(tap, x) + 1))(1.)
  report = barrier_report()
  assert len(caught) == 1
  assert "barrier_wait" in str(caught[0])
  assert "inside" in str(caught[0])
  assert report is None or report.__cause__ is caught[0]
  # The receiver kept going; the synchronous mode stopped the computation.
  assert [float(v) for v in rec.args] == ([] if synchronous() else [2.])
  hcb.barrier_wait()


def test_stop_outfeed_receiver_inside_tap_raises_runtime_error():
  caught = []

  def tap(arg, transforms):
    try:
      hcb.stop_outfeed_receiver()
    except RuntimeError as error:
      caught.append(error)
      raise

  with fails_when_synchronous("stop_outfeed_receiver"):
    jax.jit(lambda x: hcb.id_tap(tap, x))(1.)
  barrier_report()
  assert len(caught) == 1 and "stop_outfeed_receiver" in str(caught[0])
  rec = Recorder()
  jax.jit(lambda x: hcb.id_tap(rec, x))(2.)
  hcb.barrier_wait()
  assert [float(v) for v in rec.args] == [2.]


# --- bad arguments, rejected at trace time ------------------------------------


def test_removed_kwargs_type_error():
  rec = Recorder()
  with pytest.raises(TypeError) as info:
    jax.jit(lambda x: hcb.id_tap(rec, x, what="x"))(1.)
  message = str(info.value)
  assert message.startswith(
      "Support for **kwargs in ``id_tap`` has been removed")
  assert "functools.partial" in message
  with pytest.raises(TypeError, match="Support for \\*\\*kwargs"):
    hcb.id_tap(rec, 1., output_stream=None)
  hcb.barrier_wait()
  assert rec.calls == []
  # The recommended replacement works.
  seen = []
  jax.jit(lambda x: hcb.id_tap(
      functools.partial(lambda a, t, what: seen.append((what, float(a))),
                        what="x"), x))(1.)
  hcb.barrier_wait()
  assert seen == [("x", 1.)]


@pytest.mark.parametrize("tap_func", [None, 3, "print"])
def test_non_callable_tap_func_rejected_at_trace_time(tap_func):
  with pytest.raises(TypeError, match="tap_func") as info:
    jax.make_jaxpr(lambda x: hcb.id_tap(tap_func, x))(1.)
  assert "callable" in str(info.value)
  with pytest.raises(TypeError, match="tap_func"):
    hcb.id_tap(tap_func, 1.)


def test_string_leaf_rejected_at_trace_time():
  rec = Recorder()
  with pytest.raises(TypeError) as info:
    jax.make_jaxpr(lambda x: hcb.id_tap(rec, (x, "label")))(1.)
  message = str(info.value)
  assert "arg" in message and "'label'" in message
  assert "closure" in message or "partial" in message  # says what to do
  with pytest.raises(TypeError, match="arg"):
    hcb.id_print({"x": 1., "name": "a string"})
  with pytest.raises(TypeError, match="arg"):
    jax.jit(lambda x: hcb.id_tap(rec, [x, object()]))(1.)
  hcb.barrier_wait()
  assert rec.calls == []


def test_device_index_out_of_range():
  with pytest.raises(ValueError, match="device_index"):
    jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x,
                                 device_index=jax.device_count()))(1.)


# --- the host function's own traceback ----------------------------------------


def cholesky_of(x, *transforms):
  """A host function (a call's, or a tap's) that fails in NumPy for a
  matrix that is not positive definite."""
  return np.linalg.cholesky(x)


def _frame_of(function, text):
  """How a traceback shows the line of `function` (defined in this file)
  that holds `text`."""
  lines, first = inspect.getsourcelines(function)
  line = first + next(i for i, source in enumerate(lines) if text in source)
  return (f'File "{inspect.getsourcefile(function)}", line {line}, '
          f"in {function.__name__}")


_CHOLESKY_FRAME = _frame_of(cholesky_of, "np.linalg.cholesky(x)")
_LINALG_ERROR = "LinAlgError: Matrix is not positive definite"


def _assert_shows_the_host_function(text, first=_CHOLESKY_FRAME):
  """`text` has the host function's traceback: its own frame (`first`:
  this file and the line that failed) first, not the package's, down to
  `cholesky_of`'s line and NumPy's exception."""
  assert _CHOLESKY_FRAME in text, text
  assert f"numpy.linalg.{_LINALG_ERROR}" in text, text
  assert f"Traceback (most recent call last):\n  {first}\n" in text, text


@pytest.mark.parametrize("op", ["call", "tap"])
def test_the_callers_error_shows_the_host_functions_traceback(op):
  """Issue 50 item 1: the error of a jitted step whose host function raised
  holds the host function's traceback in its message (as
  `jax.pure_callback`'s does), from the user's own frame, on both
  transports: on the first call, on later calls that JAX's C++ dispatch
  runs, and on calls after a failed one. In the outfeed mode a tap's error
  reaches the barrier instead, whose message holds the same traceback."""
  host = {"call": lambda x: hcb.call(cholesky_of, x, result_shape=x),
          "tap": lambda x: hcb.id_tap(cholesky_of, x)}[op]
  step = jax.jit(lambda x: host(x) + 1.)
  positive, negative = jnp.eye(2), -jnp.eye(2)
  waits = op == "call" or synchronous()
  for x in (positive, negative, negative, positive, negative):
    if x is positive:
      jax.block_until_ready(step(x))
      continue
    if not waits:
      jax.block_until_ready(step(x))
      _assert_shows_the_host_function(str(barrier_report()))
      continue
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError),
                       match=_LINALG_ERROR) as info:
      jax.block_until_ready(step(x))
    _assert_shows_the_host_function(str(info.value))
    if not synchronous():  # a call's error reaches the barrier too
      _assert_shows_the_host_function(str(barrier_report()))
  hcb.barrier_wait()


@pytest.mark.parametrize("op", ["call", "tap"])
def test_an_eager_error_is_chained_to_the_host_functions_exception(op):
  """Eager use in the synchronous mode runs the host function on the
  caller's thread: the error it raises there is chained to the host
  function's own exception, and its message holds the traceback. In the
  outfeed mode a call's error is JAX's failed computation's (a message,
  with the traceback), a tap's reaches the barrier."""
  raised = []

  def failing(x, *transforms):
    try:
      return cholesky_of(x)
    except np.linalg.LinAlgError as error:
      raised.append(error)
      raise

  host = {"call": lambda x: hcb.call(failing, x, result_shape=x),
          "tap": lambda x: hcb.id_tap(failing, x)}[op]
  shows_failing = functools.partial(
      _assert_shows_the_host_function,
      first=_frame_of(failing, "cholesky_of(x)"))
  if op == "tap" and not synchronous():
    host(-jnp.eye(2))
    report = barrier_report()
    assert report.__cause__ is raised[0]
    shows_failing(str(report))
    return
  with pytest.raises(jax.errors.JaxRuntimeError, match=_LINALG_ERROR) as info:
    jax.block_until_ready(host(-jnp.eye(2)))
  shows_failing(str(info.value))
  if synchronous():
    assert info.value.__cause__ is raised[0]
  else:
    assert barrier_report().__cause__.__cause__ is raised[0]


def test_an_error_only_the_barrier_reports_is_logged_once_with_its_traceback(
    caplog):
  """A tap's error in the outfeed mode would be lost until the barrier: it
  is logged at once, at ERROR level, once, with the host function's
  traceback. An error that fails the caller's computation is logged at
  DEBUG level only (its message holds the traceback)."""
  step = jax.jit(lambda x: hcb.id_tap(cholesky_of, x) + 1.)
  with caplog.at_level(logging.ERROR, logger="host_callback"):
    with fails_when_synchronous(_LINALG_ERROR):
      jax.block_until_ready(step(-jnp.eye(2)))
    barrier_report()
  errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
  if synchronous():
    assert errors == []
    return
  assert len(errors) == 1, errors
  message = errors[0].getMessage()
  assert message.startswith("Postponing exception raised in callback "
                            "function: Traceback (most recent call last):")
  _assert_shows_the_host_function(message)


def test_an_error_that_failed_its_computation_is_raised_once(both_modes):
  """Synchronous mode: the tap's computation fails, and the barrier does not
  raise the error again, as in the original. Outfeed mode: the computation
  does not wait, and the barrier raises it."""
  f = jax.jit(lambda x: hcb.id_tap(raise_user_error, x) + 1)
  if both_modes == "synchronous":
    with pytest.raises(Exception, match="user message 1"):
      jax.block_until_ready(f(1))
    with pytest.raises(Exception, match="user message 2"):
      jax.block_until_ready(hcb.id_tap(raise_user_error, jnp.int32(2)))
  else:
    assert int(f(1)) == 2
    with pytest.raises(hcb.CallbackException, match="user message 1"):
      hcb.barrier_wait()
  hcb.barrier_wait()
  assert int(jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x) + 1)(1)) == 2


def test_an_error_of_call_is_raised_at_the_barrier_in_outfeed_mode_only(
    both_modes):
  """A `call` always waits, so its computation fails in both modes; the
  barrier raises the error again in the outfeed mode only, as the original
  did in each mode."""
  def broken(x):
    raise UserError("broken call")

  with pytest.raises(Exception, match="broken call"):
    jax.block_until_ready(jax.jit(
        lambda x: hcb.call(broken, x, result_shape=x))(1.))
  if both_modes == "outfeed":
    with pytest.raises(hcb.CallbackException, match="broken call"):
      hcb.barrier_wait()
  hcb.barrier_wait()


def test_synchronous_mode_an_error_kept_for_the_barrier_is_not_lost(
    both_modes):
  """A tap of a computation compiled in the outfeed mode fails nothing: its
  error still reaches the barrier in the synchronous mode."""
  f = jax.jit(lambda x: hcb.id_tap(raise_user_error, x) + 1)
  jax.config.update("jax_host_callback_outfeed", True)
  assert int(f(3)) == 4
  jax.config.update("jax_host_callback_outfeed", both_modes == "outfeed")
  with pytest.raises(hcb.CallbackException, match="user message 3"):
    hcb.barrier_wait()


def test_synchronous_pmap_error_is_not_reported_again_at_exit(transport):
  """Issue 24 item 4: JAX kept the failed pmap's runtime tokens and raised
  the error twice more at exit ('Exception ignored in atexit callback')."""
  done = run_python("""
      import jax, jax.numpy as jnp, host_callback as hcb
      def broken(a, t):
        raise ValueError("boom")
      try:
        jax.jit(lambda x: hcb.id_tap(broken, x) + 1)(1)
      except Exception:
        print("jit raised")
      hcb.barrier_wait()
      try:
        jax.pmap(lambda x: hcb.id_tap(broken, x) + 1)(
            jnp.arange(2)).block_until_ready()
      except Exception:
        print("pmap raised")
      hcb.barrier_wait()
      print("done")
      """, env={"JAX_HOST_CALLBACK_OUTFEED": "0"}, transport=transport,
      timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout == "jit raised\npmap raised\ndone\n"
  assert "Exception ignored" not in done.stderr, done.stderr
  assert "CallbackException" not in done.stderr, done.stderr


_FAILING_SYNCHRONOUS_COMPUTATIONS = {
    "pmap": """
      f = jax.pmap(lambda x: hcb.id_tap(broken, x) * 2.0)
      run = lambda: f(jnp.ones(2)).block_until_ready()
      """,
    "sharded jit": """
      mesh = jax.sharding.Mesh(jax.devices()[:2], ("d",))
      sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
      x = jax.device_put(jnp.ones(2), sharding)
      run = lambda: jax.jit(lambda v: hcb.id_tap(broken, v) * 2.0)(
          x).block_until_ready()
      """,
    "pmap on two threads": """
      f = jax.pmap(lambda x: hcb.id_tap(broken, x) * 2.0)
      def run():
        outcomes = []
        def worker():
          try:
            f(jnp.ones(2)).block_until_ready()
          except Exception as error:
            outcomes.append(error)
        thread = threading.Thread(target=worker)
        thread.start()
        try:
          f(jnp.ones(2)).block_until_ready()
        finally:
          thread.join()
          assert len(outcomes) == 1, outcomes
      """,
}


@pytest.mark.parametrize("failing", sorted(_FAILING_SYNCHRONOUS_COMPUTATIONS))
def test_a_failed_synchronous_computation_is_the_only_report_at_exit(
    transport, failing):
  """Issue 33 item 1: the program handles the failed computation's error
  and never calls the barrier; at exit nothing is reported again (JAX kept
  the failure in its runtime tokens)."""
  done = run_python("""
      import threading, jax, jax.numpy as jnp, host_callback as hcb
      def broken(a, t):
        raise ValueError("boom")
      """ + _FAILING_SYNCHRONOUS_COMPUTATIONS[failing] + """
      try:
        run()
      except Exception as error:
        print("raised", type(error).__name__)
      print("END")
      """, transport=transport, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout == "raised JaxRuntimeError\nEND\n", done.stderr
  assert "Exception ignored" not in done.stderr, done.stderr
  assert "CallbackException" not in done.stderr, done.stderr


def test_an_error_no_barrier_raised_is_reported_at_exit(transport):
  """As the original's exit handler did: the drain at exit raises the tap's
  error, which no barrier raised, and Python prints it once."""
  done = run_python("""
      import jax, host_callback as hcb
      def broken(a, t):
        raise ValueError("never seen by a barrier")
      jax.jit(lambda x: hcb.id_tap(broken, x) + 1)(1)
      print("END")
      """, env=OUTFEED, transport=transport, timeout=120)
  assert done.stdout == "END\n", done.stderr
  assert done.stderr.count("Exception ignored in atexit callback") == 1, (
      done.stderr)
  assert ("CallbackException: There were exceptions during callback "
          "processing") in done.stderr, done.stderr
  assert "ValueError: never seen by a barrier" in done.stderr, done.stderr
  # Logged once, when it happened, and raised once, by the drain: each
  # with the host function's own frame (line 4 of the script).
  assert done.stderr.count("Postponing exception raised in callback "
                           "function") == 1, done.stderr
  assert done.stderr.count('File "<string>", line 4, in broken') == 2, (
      done.stderr)


@pytest.mark.parametrize("tap_func, shown", [
    (lambda a: None, "<lambda>(a)"),
    (lambda a, t, b: None, "<lambda>(a, t, b)"),
    (print_x, "print_x(x)"),
])
def test_tap_function_with_wrong_signature_rejected_at_trace_time(tap_func,
                                                                  shown):
  with pytest.raises(TypeError, match=re.escape(shown) +
                     r" cannot be called as tap_func\(arg, transforms\)"):
    jax.jit(lambda x: hcb.id_tap(tap_func, x))(1.)


def test_tap_function_without_device_parameter_rejected_with_tap_with_device():
  with pytest.raises(TypeError, match=r"cannot be called as tap_func\(arg, "
                     r"transforms, \*, device\)"):
    hcb.id_tap(lambda a, t: None, 1., tap_with_device=True)


def test_tap_function_whose_signature_is_unknown_is_reported_at_barrier_once(
    transport, both_modes):
  """`vars` has no signature to inspect, and takes one argument: the
  TypeError reaches the barrier, and shows once in the barrier's exception
  (and once in the log, when it happened), with no frame of the package's
  (a builtin host function has none of its own either). In the
  synchronous mode the failed computation is the only report: the program
  caught it, and nothing is logged."""
  done = run_python(f"""
      import jax, host_callback as hcb
      try:
        jax.jit(lambda x: hcb.id_tap(vars, x))(1.)
      except jax.errors.JaxRuntimeError:  # the synchronous mode fails it
        assert {both_modes == "synchronous"}
      hcb.barrier_wait()
      """, env=OUTFEED if both_modes == "outfeed" else None,
      transport=transport, timeout=60)
  if both_modes == "synchronous":
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return
  assert done.returncode != 0
  assert "CallbackException: There were exceptions" in done.stderr
  raised = "TypeError: vars expected at most 1 argument, got 2"
  assert done.stderr.count(f"\n{raised}\n") == 1, done.stderr
  assert done.stderr.count(f"callback function: {raised}\n") == 1, (
      done.stderr)
  assert "host_functions.py" not in done.stderr


def test_errors_do_not_break_other_devices():
  rec = Recorder()
  devices = cpu_devices(4)

  def tap(arg, transforms, *, device):
    rec(arg, transforms, device=device)
    if device == devices[1]:
      raise UserError("device 1")

  with fails_when_synchronous("device 1"):
    out = jax.pmap(lambda x: hcb.id_tap(tap, x, tap_with_device=True),
                   devices=devices)(jnp.arange(4.))
    np.testing.assert_array_equal(out, np.arange(4.))
  barrier_report()
  assert sorted(float(v) for v in rec.args) == [0., 1., 2., 3.]


def test_traced_keyword_argument_of_id_print_warns_naming_it():
  stream = io.StringIO()
  with pytest.warns(UserWarning, match=r"keyword argument step= is a traced "
                    r"value.*pass it in arg, e.g. id_print\(\(step, x\)\)"):
    jax.jit(lambda i, x: hcb.id_print(x, step=i, output_stream=stream))(3, 1.)
  hcb.barrier_wait()
  assert stream.getvalue().startswith("step: ")  # printed as the original did
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.jit(lambda x: hcb.id_print(x, step=3, output_stream=stream))(1.)
  hcb.barrier_wait()
