"""Builds the native transport of host_callback (receiver/native/*.cc), a
CPython extension module, `host_callback.receiver._native`.

The metadata lives in setup.cfg. The extension is built once for every
supported Python and JAX:

- against the XLA FFI headers of API version 0.3 (JAX 0.10's) kept in
  `receiver/native/third_party/`, which every supported jaxlib accepts, so
  the build needs no jaxlib;
- for CPython's stable ABI of Python 3.11 (`Py_LIMITED_API`), so one
  `abi3` wheel serves Python 3.11 to 3.13;
- its sources compiled in parallel, one job per core.

`HOST_CALLBACK_PORTABLE=1` in the environment builds the portable branches
of the native core's Linux-only calls (`receiver/native/portability.h`), the
code macOS runs, on Linux too: CI tests that variant (`.ci/run`).

The extension is optional: without a C++17 compiler or NumPy's C headers
the install still succeeds with one warning, and host_callback uses its
Python transport.
"""

import concurrent.futures
import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE_DIR = os.path.join("receiver", "native")
FFI_HEADERS_DIR = os.path.join(NATIVE_DIR, "third_party")
# CPython's stable ABI as of Python 3.11, the oldest supported Python.
LIMITED_API = "0x030B0000"
# The build flag of the portable branches (above).
PORTABLE_MACROS = ([("HCB_PORTABLE", "1")]
                   if os.environ.get("HOST_CALLBACK_PORTABLE") == "1" else [])
FALLBACK = ("host_callback will use its Python transport, which is slower "
            "(install a C++17 compiler and reinstall host-callback to get "
            "the native one)")


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


def compile_in_parallel(compiler, sources, output_dir=None, macros=None,
                        include_dirs=None, debug=0, extra_preargs=None,
                        extra_postargs=None, depends=None):
  """`CCompiler.compile`, one source per core at a time (distutils compiles
  an extension's sources one after the other)."""
  macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(  # pylint: disable=protected-access
      output_dir, macros, include_dirs, sources, depends, extra_postargs)
  cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)  # pylint: disable=protected-access

  def compile_one(item):
    obj, (src, ext) = item
    compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)  # pylint: disable=protected-access

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    list(pool.map(compile_one, build.items()))
  return objects


def remove_stale_builds():
  """Deletes the modules that builds for one Python's ABI left in the
  checkout (`pip install -e` builds in place): Python would import them
  before the `abi3` one."""
  for path in glob.glob(os.path.join("receiver", "_native.cpython-*.so")):
    os.remove(path)


class OptionalBuildExt(build_ext):
  """Builds the native library when it can, and warns once when it cannot."""

  def build_extension(self, ext):
    numpy_include = numpy_include_dir()
    if numpy_include is None:
      warn("NumPy's C headers were not found at build time")
      return
    # System includes: keep the headers' own warnings out of the build log.
    ext.extra_compile_args += ["-isystem", FFI_HEADERS_DIR,
                               "-isystem", numpy_include]
    self.compiler.compile = (
        lambda sources, **kwargs: compile_in_parallel(self.compiler, sources,
                                                      **kwargs))
    remove_stale_builds()
    try:
      super().build_extension(ext)
    except Exception as error:  # pylint: disable=broad-except
      # distutils' CompileError/LinkError, or OSError for a missing compiler.
      warn(f"the native transport could not be compiled ({error})")


# The native core by part (see docs/architecture.md, "The native parts").
SOURCES = (
    "block_pool.cc", "device_queue.cc", "device_queue_claims.cc",
    "calls.cc", "direct_runs.cc",
    "interrupts.cc", "receiver_link.cc", "site_sizes.cc", "hub.cc",
    "ffi_common.cc", "huge_pages.cc", "ffi_cpu.cc", "cuda_api.cc", "cuda_copies.cc",
    "ffi_cuda.cc",
    "module.cc", "module_support.cc", "module_queues.cc", "module_cuda.cc",
    "module_testing.cc", "python_hooks.cc", "idle_check.cc",
    "dispatched_outputs.cc", "python_runner.cc",
    "python_plain_tap.cc",
    "python_arguments.cc", "python_results.cc",
    "python_sites.cc", "python_memory.cc", "python_dlpack.cc",
    "python_instances.cc", "python_consume.cc",
)
HEADERS = (
    "status.h", "packet.h", "waits.h", "block_pool.h", "device_queue.h",
    "calls.h", "direct_runs.h", "interrupts.h", "receiver_link.h",
    "site_sizes.h", "hub.h", "executions.h", "dispatches.h",
    "dispatched_outputs.h", "ffi_common.h",
    "ffi_targets.h", "huge_pages.h", "portability.h", "ffi_cpu.h",
    "cuda_api.h", "cuda_copies.h", "ffi_cuda.h",
    "module_support.h", "python_hooks.h", "python_limited.h",
    "python_memory.h", "python_runner.h", "python_arguments.h",
    "python_results.h", "python_sites.h",
    "python_dlpack.h", "python_gil.h",
)

native = Extension(
    "host_callback.receiver._native",
    # dlopen, for the CUDA runtime found at run time (cuda_api.cc).
    libraries=["dl"],
    sources=[os.path.join(NATIVE_DIR, name) for name in SOURCES],
    depends=[os.path.join(NATIVE_DIR, name) for name in HEADERS] + [
        os.path.join(FFI_HEADERS_DIR, "xla", "ffi", "api", name)
        for name in ("api.h", "c_api.h", "ffi.h")],
    language="c++",
    define_macros=[("Py_LIMITED_API", LIMITED_API)] + PORTABLE_MACROS,
    py_limited_api=True,
    extra_compile_args=["-std=c++17", "-O2", "-g0", "-fvisibility=hidden"],
)

setup(ext_modules=[native], cmdclass={"build_ext": OptionalBuildExt})
