"""A tap never breaks a program: what compiles without taps compiles with
them and returns the same values, bitwise.

The reduced case of XLA's CPU library fusion bug (docs/xla_root_fusion.md):
a step returns a product (or an activation of one) and taps a reduction of
it. Without the package's lowering XLA refuses to compile it. Each variant
runs on both transports and in both modes, and is compared with the same
function without the tap.
"""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb

from helpers import Recorder, compiled_modules, cpu_devices, run_python

pytestmark = pytest.mark.usefixtures("both_modes")

class _Retries(logging.Handler):
  """Counts the compile retries host_callback logs."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.count = 0

  def emit(self, record):
    self.count += "compiled again" in record.getMessage()


@pytest.fixture(autouse=True)
def retries():
  """How many refused compiles were retried: none unless a test expects it
  (the lowering itself avoids XLA's refusal on one device)."""
  logger = logging.getLogger("host_callback")
  handler, level = _Retries(), logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.DEBUG)
  yield handler
  logger.removeHandler(handler)
  logger.setLevel(level)
  assert handler.count == 0, "a compile was retried"


REDUCTIONS = {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max}
ACTIVATIONS = {"none": lambda y: y, "tanh": jnp.tanh,
               "relu": jax.nn.relu, "exp": jnp.exp}


def _inputs(size):
  rng = np.random.default_rng(size)
  x = jnp.asarray(rng.standard_normal((size, size)), jnp.float32) / 8
  w = jnp.asarray(rng.standard_normal((size, size)), jnp.float32) / 8
  return x, w


def _step(observe, activation, reduction):
  def step(x, w):
    y = activation(x @ w)
    observe(reduction(y))
    return y
  return step


def _check_same_as_untapped(step, untapped, args, received, reduction):
  out = np.asarray(jax.jit(step)(*args))
  expected = np.asarray(jax.jit(untapped)(*args))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, expected)  # bitwise
  assert len(received) == 1
  np.testing.assert_allclose(np.asarray(received[0][0]),
                             np.asarray(reduction(expected)), rtol=1e-5)


@pytest.mark.parametrize("size", [64, 256])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("reduction", sorted(REDUCTIONS))
def test_tap_of_a_reduction_of_the_returned_product(size, activation,
                                                    reduction):
  tap = Recorder()
  step = _step(lambda v: hcb.id_tap(tap, v), ACTIVATIONS[activation],
               REDUCTIONS[reduction])
  untapped = _step(lambda v: None, ACTIVATIONS[activation],
                   REDUCTIONS[reduction])
  _check_same_as_untapped(step, untapped, _inputs(size), tap.calls,
                          REDUCTIONS[reduction])


@pytest.mark.parametrize("reduction", sorted(REDUCTIONS))
def test_call_of_a_reduction_of_the_returned_product(reduction):
  received = []

  def host(v):
    received.append((v,))
    return v

  def observe(v):
    hcb.call(host, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))

  step = _step(observe, jnp.tanh, REDUCTIONS[reduction])
  untapped = _step(lambda v: None, jnp.tanh, REDUCTIONS[reduction])
  _check_same_as_untapped(step, untapped, _inputs(64), received,
                          REDUCTIONS[reduction])


def test_tap_of_a_reduction_of_a_returned_elementwise_result():
  """The library fusion starts from elementwise ops too: no product."""
  tap = Recorder()

  def step(x, w, observe):
    y = jnp.tanh(x + w)
    observe(jnp.sum(y))
    return y

  x, w = _inputs(64)
  out = jax.jit(lambda x, w: step(x, w, lambda v: hcb.id_tap(tap, v)))(x, w)
  expected = jax.jit(lambda x, w: step(x, w, lambda v: None))(x, w)
  hcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
  np.testing.assert_allclose(tap.args[0], np.sum(np.asarray(expected)),
                             rtol=1e-5)


def test_id_print_of_the_loss_beside_the_returned_logits(capsys):
  """'Log the loss and return the logits'."""
  def logits(x, w, labels, log):
    out = x @ w
    loss = -jnp.mean(jnp.sum(jax.nn.log_softmax(out) * labels, axis=-1))
    log(loss)
    return out

  x, w = _inputs(128)
  labels = jax.nn.one_hot(jnp.arange(128) % 10, 128)
  out = jax.jit(lambda *a: logits(*a, lambda v: hcb.id_print(v, what="loss"))
                )(x, w, labels)
  expected = jax.jit(lambda *a: logits(*a, lambda v: None))(x, w, labels)
  hcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
  assert capsys.readouterr().out.startswith("what: loss\n")


def test_ahead_of_time_compilation():
  tap = Recorder()
  step = _step(lambda v: hcb.id_tap(tap, v), jnp.tanh, jnp.sum)
  x, w = _inputs(64)
  compiled = jax.jit(step).lower(x, w).compile()
  out = compiled(x, w)
  hcb.barrier_wait()
  expected = jax.jit(_step(lambda v: None, jnp.tanh, jnp.sum))(x, w)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
  assert len(tap.args) == 1


def test_automatically_sharded_step(retries):
  """Sharded over 4 devices, where the lowering cannot keep the ROOT: the
  refused computation is compiled again, and returns the same values
  (bitwise here: only a reduction's fusion changes)."""
  devices = cpu_devices(4)
  mesh = jax.sharding.Mesh(np.array(devices), ("d",))
  x, w = _inputs(256)
  x = jax.device_put(x, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("d")))
  w = jax.device_put(w, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))
  tap = Recorder()
  out = jax.jit(_step(lambda v: hcb.id_tap(tap, v), jnp.tanh, jnp.sum))(x, w)
  expected = jax.jit(_step(lambda v: None, jnp.tanh, jnp.sum))(x, w)
  hcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
  np.testing.assert_allclose(tap.args[0], np.sum(np.asarray(expected)),
                             rtol=1e-5)
  assert retries.count == 1
  retries.count = 0


_RETRIED = """
    import logging, warnings
    import jax, jax.numpy as jnp, numpy as np
    if {refuse}:  # no native handlers: the Python transport, no end mark
      def refuse(name, *args, **kwargs):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: refused")
      jax.ffi.register_ffi_target = refuse
    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
    logging.getLogger("host_callback").setLevel(logging.DEBUG)
    import host_callback as hcb

    seen = []
    def step(x, w, observe):
      y = jnp.tanh(x @ w)
      observe(jnp.sum(y))
      return y

    x = jnp.full((256, 64), 0.01); w = jnp.full((64, 64), 0.02)
    if {sharded}:
      mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
      x = jax.device_put(x, jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec("d")))
    out = jax.jit(lambda x, w: step(x, w, lambda v: hcb.id_tap(
        lambda v, t: seen.append(float(v)), v)))(x, w)
    hcb.barrier_wait()
    expected = np.asarray(jax.jit(lambda x, w: step(x, w, lambda v: None))(
        x, w))
    print("same values:", np.array_equal(out, expected),
          "taps:", len(seen), np.isclose(seen[0], expected.sum(), rtol=1e-5))
    """


@pytest.mark.parametrize("case", ["without native handlers", "sharded"])
def test_a_retried_compile_shows_nothing_but_a_debug_line(case, transport,
                                                          both_modes):
  """Where the lowering cannot keep the ROOT, XLA's refusal is caught: the
  program works, stderr holds nothing of it, and the debug log says it."""
  if case == "without native handlers" and transport != "python":
    pytest.skip("one run: the child has the Python transport only")
  if case == "sharded" and both_modes != "synchronous":
    pytest.skip("one run per transport")
  code = _RETRIED.format(refuse=case == "without native handlers",
                         sharded=case == "sharded")
  done = run_python(code, transport=None if case != "sharded" else transport)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[-1] == "same values: True taps: 1 True"
  assert all(line.startswith("LOG ") for line in done.stderr.splitlines()
             if line), done.stderr  # nothing of XLA's refusal
  debug = [line for line in done.stderr.splitlines()
           if "compiled again" in line]
  assert len(debug) == 1, done.stderr
  assert debug[0].startswith("LOG host_callback: XLA refused to compile a "
                             "computation with taps or calls (INTERNAL: ")


def test_a_refused_gpu_computation_is_compiled_again_behind_a_barrier(
    caplog, retries, both_modes, transport):
  """On a GPU (an H200, jax 0.11.2) XLA refused the tapped 64x64 step, and
  compiled it with its result behind an optimization barrier (docs/gpu.md):
  a GPU computation refused so is compiled once more that way, the first
  error standing if that fails too; another error is not retried. Here
  XLA's answers are stand-ins."""
  if (both_modes, transport) != ("outfeed", "native"):
    pytest.skip("no computation runs: one run")
  from host_callback.primitive import compile_retry
  refusal = ("INTERNAL: RET_CHECK failure (external/xla+/xla/hlo/ir/"
             "hlo_computation.cc:680) instruction->IsDead() ")
  attempts = []

  def refusing(times, error=refusal):
    def compile_with(options, *, result_barrier=False):
      attempts.append((options, result_barrier))
      if len(attempts) <= times:
        raise RuntimeError(f"{error}{len(attempts)}")
      return "executable"
    return compile_with

  caplog.set_level(logging.DEBUG, logger="host_callback")
  assert compile_retry.compile_ours(refusing(1), platform="gpu",
                                    root_kept=False) == "executable"
  assert attempts == [((), False), ((), True)]
  assert ("compiled again with its results behind an optimization barrier"
          in caplog.text)
  retries.count = 0
  for times, error, tries in [(2, refusal, 2), (1, "RESOURCE_EXHAUSTED: ", 1)]:
    attempts.clear()
    with pytest.raises(RuntimeError, match=f"^{re.escape(error)}1$"):
      compile_retry.compile_ours(refusing(times, error), platform="gpu",
                                 root_kept=False)
    assert attempts == [((), False), ((), True)][:tries]


def test_the_barrier_retry_compiles_the_module_with_its_results_behind_it(
    monkeypatch, retries):
  """The GPU's retry, run on CPU where XLA refuses the sharded step: the
  module compiled again is a copy whose main returns its results through
  one optimization barrier, XLA compiles that copy, and the step's values
  are the untapped ones."""
  from host_callback import _jax_adapter
  from host_callback.primitive import compile_retry
  monkeypatch.setitem(compile_retry.RETRIES, "cpu", compile_retry.Retry(
      compile_retry.NO_REDUCTION_FUSION, True, None, True,
      "behind a barrier (test)"))
  rewritten, rewrite = [], _jax_adapter.with_result_barrier

  def spy(module):
    before = str(module)
    copy = rewrite(module)
    rewritten.append((before, str(module), str(copy)))
    return copy
  monkeypatch.setattr(_jax_adapter, "with_result_barrier", spy)
  compiled = compiled_modules(monkeypatch)
  test_automatically_sharded_step(retries)
  [(before, after, copy)] = rewritten
  assert before == after and "optimization_barrier" not in before
  # the copy, which XLA took
  assert ["optimization_barrier" in str(module)
          for module, _ in compiled].count(True) == 1
  main = copy[copy.index("func.func public @main"):]
  barrier = re.search(r"(%\S+)(?::\d+)? = stablehlo\.optimization_barrier "
                      r"(%\S+)", main)
  returned = re.search(r"\n    return (%\S+) ", main).group(1)  # main's
  assert barrier and returned == barrier.group(1), main
