"""How the native module is built, and what happens when XLA refuses it.

One build serves every supported Python and JAX: its XLA FFI handlers are
built with the FFI headers of API 0.3 (JAX 0.10's) kept in the repository,
which every supported jaxlib accepts, for CPython's stable ABI; and a
refused registration makes the package warn once and use the Python
transport instead of failing every computation.
"""

import configparser
import pathlib
import re

import numpy as np
import pytest

from host_callback.receiver import native_library
from helpers import linux_only_calls_built, run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent
FFI_HEADERS = ROOT / "receiver" / "native" / "third_party" / "xla"


def _native():
  if not native_library.available():
    pytest.skip("the native transport is not built")
  return native_library.native


def test_handlers_are_built_for_the_oldest_supported_ffi_api():
  c_api = (FFI_HEADERS / "ffi" / "api" / "c_api.h").read_text()
  header_version = tuple(
      int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", c_api).group(1))
      for part in ("MAJOR", "MINOR"))
  assert header_version == (0, 3)  # jaxlib 0.10's, the oldest supported
  assert _native().XLA_FFI_API_VERSION == (0, 3)


def test_module_is_built_for_the_stable_abi():
  assert _native().__file__.endswith(".abi3.so")


def test_build_needs_neither_jaxlib_nor_scipy():
  build = (ROOT / "pyproject.toml").read_text()
  requires = re.search(r"requires = \[(.*?)\]", build, re.S).group(1)
  names = sorted(re.findall(r'"([A-Za-z0-9_-]+)', requires))
  assert names == ["numpy", "setuptools"]
  assert (FFI_HEADERS / "LICENSE").read_text().lstrip().startswith(
      "Apache License")


def test_linux_only_calls_follow_the_portable_build_flag():
  """HOST_CALLBACK_PORTABLE=1, at build and at test time, builds the
  portable branches (receiver/native/portability.h), the code macOS runs:
  the module then links none of the Linux-only functions; a Linux build
  without the flag links them all."""
  module = pathlib.Path(_native().__file__).read_bytes()
  linux_only = [name for name in (b"madvise", b"uname") if name in module]
  assert linux_only == ([b"madvise", b"uname"] if linux_only_calls_built()
                        else [])


def test_wheel_is_tagged_for_the_stable_abi():
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")
  assert config["bdist_wheel"]["py_limited_api"] == "cp311"


_REFUSED = """
    import warnings
    import jax, jax.numpy as jnp

    def refuse(name, *args, **kwargs):
      raise jax.errors.JaxRuntimeError(
          f"INVALID_ARGUMENT: XLA FFI handler registration for {name} on "
          "platform Host failed because the handler's API version (9.1) is "
          "incompatible with the framework's API version (0.3).")

    jax.ffi.register_ffi_target = refuse  # as a jaxlib too old for the build
    import host_callback as hcb
    from host_callback.host import host_side, transport_policy

    seen = []
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for scale in (1.0, 2.0):  # two computations, one warning
        @jax.jit
        def step(x):
          x = hcb.id_tap(lambda v, t: seen.append(v.tolist()), x * scale)
          return hcb.call(lambda v: v + 1, x, result_shape=x)
        out = step(jnp.arange(3.0))
      hcb.barrier_wait()
    print(out.tolist(), seen, transport_policy.native_on_cpu(),
          sorted(host_side.runtime.transports()))
    for warning in caught:
      print(warning.category.__name__, warning.message)
    """


@pytest.mark.parametrize("chosen", ["auto", "native"])
@pytest.mark.parametrize("outfeed", ["0", "1"])
def test_refused_handlers_warn_once_and_use_the_python_transport(
    transport, chosen, outfeed):
  """XLA refusing the handlers (here: every registration raises, as for a
  jaxlib whose FFI API is older than the build's) leaves taps and calls
  working on the Python transport, after one warning naming the cause."""
  if transport != "python" or not native_library.available():
    pytest.skip("one run, in a child process, where the module is built")
  done = run_python(_REFUSED, transport=chosen,
                    env={"JAX_HOST_CALLBACK_OUTFEED": outfeed})
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0] == ("[1.0, 3.0, 5.0] [[0.0, 1.0, 2.0], [0.0, 2.0, 4.0]] "
                      "False ['python']")
  assert len(lines) == 2, lines
  assert lines[1].startswith(
      "RuntimeWarning host_callback: XLA refused the native transport's "
      "handlers on CPU (JaxRuntimeError: INVALID_ARGUMENT: XLA FFI handler "
      "registration for host_callback_")
  assert lines[1].endswith(
      "so the slower Python transport is used there; install a "
      "host-callback release that supports the installed jaxlib (the README "
      "lists the supported JAX versions), or set "
      "JAX_HOST_CALLBACK_TRANSPORT=python to silence this warning.")


def test_constants_both_sides_use_agree():
  """The native module exports its constants; those the Python side also
  needs without it are checked against them here."""
  from host_callback.host import device_numbers as devices  # pylint: disable=import-outside-toplevel
  from host_callback.receiver import native_wire, packets, queues  # pylint: disable=import-outside-toplevel
  native = _native()
  # The Python transport's consumer waits as long as the native one.
  assert queues.GUEST_GRACE_SECONDS == pytest.approx(native.GUEST_GRACE_SECONDS)
  # Every wait re-checks its way out as often on both sides.
  assert packets.POLL_SECONDS == pytest.approx(native.POLL_SECONDS)
  # The dtypes packed below a byte: the Python rule is the C++ table.
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  rule = {name: native_wire.packed_bits(np.dtype(getattr(ml_dtypes, name)))
          for name in dir(ml_dtypes)
          if isinstance(getattr(ml_dtypes, name), type)
          and issubclass(getattr(ml_dtypes, name), np.generic)}
  assert {name: bits for name, bits in rule.items() if bits} == (
      native.PACKED_BITS)
  # The FFI targets' names come from the module.
  assert native_library.OUTFEED_TARGET == native.OUTFEED_TARGET == (
      "host_callback_outfeed")
  # The CUDA handlers' queue of GPU 0 is the number devices gives it.
  gpu = type("Gpu", (), {"platform": "cuda", "id": 0})()
  assert devices.device_number(gpu) == native.CUDA_QUEUE_BASE
