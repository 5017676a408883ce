"""Test set-up: 4 CPU devices, and every test run on each available transport.

Tests run in the outfeed mode (asynchronous taps) unless they choose a mode;
modules that use the `both_modes` fixture run in both modes.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback import runtime, settings  # noqa: E402


@pytest.fixture(autouse=True, params=runtime.available_transports())
def transport(request):
  """Runs the test with `jax_host_callback_transport` set to each transport."""
  jax.config.update("jax_host_callback_transport", request.param)
  jax.config.update("jax_host_callback_outfeed", True)
  yield request.param
  try:
    hcb.barrier_wait("test teardown")
  except hcb.CallbackException as error:
    if not request.node.get_closest_marker("leaves_callback_error"):
      pytest.fail(f"a host function raised and the test did not check it: "
                  f"{error}", pytrace=False)
  finally:
    jax.config.update("jax_host_callback_transport", "auto")


@pytest.fixture(params=["outfeed", "synchronous"])
def both_modes(request, transport):
  """Runs the test in the outfeed mode and in the synchronous mode."""
  del transport  # set first
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
