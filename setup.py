"""Builds the native transport of host_callback (receiver/native/*.cc), a
CPython extension module, `host_callback.receiver._native`.

The metadata lives in setup.cfg. The extension is optional: without a C++17
compiler, or without the XLA FFI headers that jaxlib ships or NumPy's C
headers, the install still succeeds with one warning, and host_callback uses
its Python transport.
"""

import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_DIR = os.path.join("receiver", "native")
FALLBACK = ("host_callback will use its Python transport, which is slower "
            "(install a C++17 compiler and reinstall host-callback to get "
            "the native one)")


def ffi_include_dir():
  """jaxlib's include directory (what `jax.ffi.include_dir()` returns).

  Found without importing jax, so that the build works with only jaxlib
  installed (pyproject.toml's build requirements).
  """
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or not spec.submodule_search_locations:
    return None
  for location in spec.submodule_search_locations:
    include = os.path.join(location, "include")
    if os.path.exists(os.path.join(include, "xla", "ffi", "api", "ffi.h")):
      return include
  return None


def numpy_include_dir():
  """NumPy's C headers (a build requirement in pyproject.toml), or None."""
  try:
    import numpy  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return numpy.get_include()


def warn(reason):
  """The single warning of a build without the native transport."""
  sys.stderr.write(f"WARNING: host_callback: {reason}; {FALLBACK}.\n")


class OptionalBuildExt(build_ext):
  """Builds the native library when it can, and warns once when it cannot."""

  def build_extension(self, ext):
    include = ffi_include_dir()
    if include is None:
      warn("jaxlib's XLA FFI headers were not found at build time")
      return
    numpy_include = numpy_include_dir()
    if numpy_include is None:
      warn("NumPy's C headers were not found at build time")
      return
    # System includes: keep the headers' own warnings out of the build log.
    ext.extra_compile_args += ["-isystem", include, "-isystem", numpy_include]
    try:
      super().build_extension(ext)
    except Exception as error:  # pylint: disable=broad-except
      # distutils' CompileError/LinkError, or OSError for a missing compiler.
      warn(f"the native transport could not be compiled ({error})")


# The native core by part (see docs/architecture.md, "The native parts").
SOURCES = (
    "block_pool.cc", "device_queue.cc", "calls.cc", "direct_runs.cc",
    "interrupts.cc", "receiver_link.cc", "site_sizes.cc", "hub.cc",
    "ffi_common.cc", "ffi_cpu.cc", "cuda_api.cc", "cuda_copies.cc",
    "ffi_cuda.cc",
    "module.cc", "python_hooks.cc", "python_runner.cc", "python_sites.cc",
    "py_memory.cc",
)
HEADERS = (
    "status.h", "packet.h", "waits.h", "block_pool.h", "device_queue.h",
    "calls.h", "direct_runs.h", "interrupts.h", "receiver_link.h",
    "site_sizes.h", "hub.h", "executions.h", "ffi_common.h", "ffi_cpu.h",
    "cuda_api.h", "cuda_copies.h", "ffi_cuda.h",
    "python_hooks.h", "python_runner.h", "python_sites.h", "py_memory.h",
)

native = Extension(
    "host_callback.receiver._native",
    # dlopen, for the CUDA runtime found at run time (cuda_api.cc).
    libraries=["dl"],
    sources=[os.path.join(NATIVE_DIR, name) for name in SOURCES],
    depends=[os.path.join(NATIVE_DIR, name) for name in HEADERS],
    language="c++",
    extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"],
)

setup(ext_modules=[native], cmdclass={"build_ext": OptionalBuildExt})
