"""One transport policy (host_callback/transport_policy.py): every
combination of platform, setting, build, CUDA validation and XLA's answer,
against a table; and the places that ask it agree with it."""

from __future__ import annotations

import itertools
import logging

import jax
import pytest

from host_callback.host import transport_policy
from host_callback.receiver import transport_native
from host_callback.host.transport_policy import NativeNotBuiltError, decide

ANY = None
RAISES = "raises"
# (platform, setting, built, cuda_validated, accepted) -> transport; the
# first row that matches decides; ANY matches anything.
TABLE = [
    (ANY, "python", ANY, ANY, ANY, "python"),
    ("rocm", ANY, ANY, ANY, ANY, "python"),
    ("tpu", ANY, ANY, ANY, ANY, "python"),
    (ANY, "native", False, ANY, ANY, RAISES),
    (ANY, "auto", False, ANY, ANY, "python"),
    ("cuda", "auto", True, False, ANY, "python"),
    (ANY, ANY, True, ANY, False, "python"),  # XLA refused the handlers
    (ANY, ANY, True, ANY, True, "native"),
]


def _expected(*facts) -> str:
  for *pattern, transport in TABLE:
    if all(p is ANY or p == f for p, f in zip(pattern, facts)):
      return transport
  raise AssertionError(f"no row for {facts}")


@pytest.mark.parametrize("facts", list(itertools.product(
    ["cpu", "cuda", "rocm", "tpu"], ["auto", "native", "python"],
    [False, True], [False, True], [False, True])))
def test_every_combination_follows_the_table(facts):
  platform, setting, built, validated, accepted = facts
  expected = _expected(*facts)
  if expected == RAISES:
    with pytest.raises(NativeNotBuiltError, match="'python' or 'auto'"):
      decide(platform, setting=setting, built=built,
             cuda_validated=validated, accepted=accepted)
    return
  choice = decide(platform, setting=setting, built=built,
                  cuda_validated=validated, accepted=accepted)
  assert choice.transport == expected
  assert choice.reason  # every choice says why


def test_cuda_gets_the_native_transport_once_validated():
  assert transport_policy.CUDA_NATIVE_VALIDATED  # by tools.gpu.check, on an H200


@pytest.mark.parametrize("setting", ["auto", "native", "python"])
def test_for_platform_reads_the_setting_and_logs_why(setting, caplog):
  if not transport_native.available():
    pytest.skip("the native transport is not built")
  transport_policy._log_choice.cache_clear()  # logged once per choice
  caplog.set_level(logging.DEBUG, logger="host_callback")
  jax.config.update("jax_host_callback_transport", setting)
  try:
    cpu = transport_policy.for_platform("cpu")
    # Tracing asks without registering CUDA handlers; here none exist.
    cuda = transport_policy.for_platform("cuda", register=False)
  finally:
    jax.config.update("jax_host_callback_transport", "auto")
  assert cpu == ("python" if setting == "python" else "native")
  assert cuda == ("python" if setting == "python" else "native")
  assert f"the {cpu} transport is used on CPU" in caplog.text


def test_the_transports_on_cpu_are_the_policy_s():
  available = transport_policy.available_on_cpu()
  assert available[0] == "python"
  assert ("native" in available) == transport_policy.native_on_cpu()
