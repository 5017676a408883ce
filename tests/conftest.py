"""Test set-up: 4 CPU devices, and every test run on each available transport.

Modes (`jax_host_callback_outfeed`):

- By default a test runs in the CPU default mode, the synchronous one (a tap
  function has run when the jitted call returns; a tap function that raises
  fails the computation that ran it).
- A test that takes the `both_modes` fixture (or a module with
  `pytestmark = pytest.mark.usefixtures("both_modes")`) runs once in the
  outfeed mode and once in the synchronous mode: the modules about delivery,
  order, errors, values and transformations do.
- A test about the outfeed mode itself (asynchronous delivery, the queue
  bound, the receiver's threads, stop and restart) takes the `outfeed_mode`
  fixture, or its module uses it.

The synchronous mode exists on CPU only: on a machine whose default backend
is not CPU its runs are skipped (the outfeed ones still run). Tests that need
several devices take them from `helpers.cpu_devices(n)`, never from
`jax.devices()`, which would be the default backend's.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback import settings  # noqa: E402
from host_callback.host import transport_policy  # noqa: E402


@pytest.fixture(autouse=True, params=transport_policy.available_on_cpu())
def transport(request):
  """Runs the test with `jax_host_callback_transport` set to each transport,
  in the synchronous mode unless the test asks for another (above)."""
  jax.config.update("jax_host_callback_transport", request.param)
  jax.config.update("jax_host_callback_outfeed", False)
  yield request.param
  try:
    hcb.barrier_wait("test teardown")
  except hcb.CallbackException as error:
    if not request.node.get_closest_marker("leaves_callback_error"):
      pytest.fail(f"a host function raised and the test did not check it: "
                  f"{error}", pytrace=False)
  finally:
    jax.config.update("jax_host_callback_transport", "auto")
    jax.config.update("jax_host_callback_outfeed", False)


@pytest.fixture
def outfeed_mode(transport):
  """Runs the test in the outfeed mode (asynchronous taps)."""
  del transport  # set first
  jax.config.update("jax_host_callback_outfeed", True)
  yield "outfeed"


@pytest.fixture(params=["outfeed", "synchronous"])
def both_modes(request, transport):
  """Runs the test in the outfeed mode and in the synchronous mode."""
  del transport  # set first
  if request.param == "synchronous" and jax.default_backend() != "cpu":
    pytest.skip("the synchronous mode exists on CPU only; the default "
                f"backend is {jax.default_backend()}")
  jax.config.update("jax_host_callback_outfeed", request.param == "outfeed")
  yield request.param


@pytest.fixture
def smallest_queue():
  """Restarts the receiver with the smallest queue bound."""
  hcb.stop_outfeed_receiver()
  jax.config.update("jax_host_callback_max_queue_byte_size",
                    settings.MIN_QUEUE_BYTES)
  yield settings.MIN_QUEUE_BYTES
  hcb.stop_outfeed_receiver()
  jax.config.update("jax_host_callback_max_queue_byte_size",
                    settings.DEFAULT_QUEUE_BYTES)
