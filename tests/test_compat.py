"""`host_callback.install()`: old `jax.experimental.host_callback` imports.

Each import form runs in a fresh interpreter, since an import is only ever
resolved once per process.
"""

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(autouse=True)
def transport():
  """Overrides conftest's per-transport runs: no test here uses a transport."""
  yield None


def run_python(code: str) -> None:
  """Runs `code` in a fresh interpreter; fails the test on a non-zero exit."""
  process = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                           capture_output=True, text=True, timeout=120,
                           check=False)
  assert process.returncode == 0, process.stderr


INSTALL = "import host_callback\nhost_callback.install()\n"


@pytest.mark.parametrize("import_line", [
    "from jax.experimental import host_callback as hcb",
    "import jax.experimental.host_callback as hcb",
    "import jax.experimental.host_callback; "
    "import jax; hcb = jax.experimental.host_callback",
])
def test_module_imports_give_the_package(import_line):
  run_python(INSTALL + import_line + """
import host_callback
assert hcb is host_callback
for name in host_callback.__all__:
  assert getattr(hcb, name) is getattr(host_callback, name), name
""")


def test_from_import_of_names():
  run_python(INSTALL + """
from jax.experimental.host_callback import (
    id_tap, id_print, call, barrier_wait, stop_outfeed_receiver,
    CallbackException, TapFunctionException)
import host_callback
assert id_tap is host_callback.id_tap
assert call is host_callback.call
assert barrier_wait is host_callback.barrier_wait
assert TapFunctionException is CallbackException
""")


def test_old_code_runs_after_install():
  run_python(INSTALL + """
import jax
import jax.numpy as jnp
from jax.experimental import host_callback as hcb

seen = []
f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x) + 1)
assert int(f(jnp.int32(41))) == 42
hcb.barrier_wait()
assert seen == [41], seen
""")


def test_install_is_idempotent():
  run_python(INSTALL + """
import sys
import jax.experimental
first = sys.modules["jax.experimental.host_callback"]
assert host_callback.install() is host_callback
assert sys.modules["jax.experimental.host_callback"] is first is host_callback
assert jax.experimental.host_callback is host_callback
""")


def test_jax_untouched_without_install():
  run_python("""
import sys
import host_callback
import jax.experimental
assert "jax.experimental.host_callback" not in sys.modules
assert not hasattr(jax.experimental, "host_callback")
try:
  import jax.experimental.host_callback
except ImportError:
  pass
else:
  raise AssertionError("import jax.experimental.host_callback worked")
try:
  from jax.experimental import host_callback as hcb
except ImportError:
  pass
else:
  raise AssertionError("from jax.experimental import host_callback worked")
""")


def test_install_wins_over_a_module_already_imported():
  """Even a `jax.experimental.host_callback` already in sys.modules (a stub a
  future JAX might ship) is replaced."""
  run_python("""
import sys
import types
import jax.experimental
stub = types.ModuleType("jax.experimental.host_callback")
sys.modules["jax.experimental.host_callback"] = stub
jax.experimental.host_callback = stub
import host_callback
host_callback.install()
from jax.experimental import host_callback as hcb
import jax.experimental.host_callback as hcb2
assert hcb is hcb2 is host_callback
""")


def test_callback_flavor_of_jax_0_4_26_to_0_4_34_is_accepted_with_one_warning():
  run_python(INSTALL + """
import warnings
import jax
import jax.numpy as jnp
from jax.experimental import host_callback as hcb

assert [f.name for f in hcb.CallbackFlavor] == ["IO_CALLBACK", "PURE", "DEBUG"]
seen = []
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  for flavor in hcb.CallbackFlavor:
    x = jax.jit(lambda v: hcb.id_tap(lambda a, t: seen.append(int(a)), v,
                                     callback_flavor=flavor))(jnp.int32(1))
    y = jax.jit(lambda v: hcb.call(lambda a: a + 1, v, result_shape=v,
                                   callback_flavor=flavor))(x)
    hcb.id_print(y, callback_flavor=flavor)
    assert int(y) == 2
hcb.barrier_wait()
assert seen == [1, 1, 1], seen
flavor_warnings = [w for w in caught if "callback_flavor" in str(w.message)]
assert len(flavor_warnings) == 1, [str(w.message) for w in caught]
assert "has no effect" in str(flavor_warnings[0].message)
""")


OLD_BARRIER_CODE = """
import host_callback
host_callback.install()
from jax.experimental import host_callback as hcb

try:
  hcb.barrier_wait()
except hcb.CallbackException as error:
  print(error)
"""


@pytest.mark.parametrize("outfeed", ["0", "1"])
def test_install_flags_code_that_expects_errors_at_the_barrier(tmp_path,
                                                                outfeed):
  """In the synchronous mode `install()` warns about the calling file's
  `barrier_wait()` in a `try` that catches CallbackException, naming the
  setting; in the outfeed mode it says nothing."""
  script = tmp_path / "old_program.py"
  script.write_text(OLD_BARRIER_CODE)
  env = {**os.environ, "JAX_HOST_CALLBACK_OUTFEED": outfeed}
  process = subprocess.run([sys.executable, str(script)], capture_output=True,
                           text=True, timeout=120, check=False, env=env)
  assert process.returncode == 0, process.stderr
  if outfeed == "1":
    assert process.stderr == ""
    return
  assert process.stderr.startswith(
      f"{script}:3: UserWarning: {script}:7: barrier_wait() in a try that "
      "catches CallbackException: this code expects tap errors at "
      "barrier_wait(), as in the original's outfeed mode;"), process.stderr
  assert "JAX_HOST_CALLBACK_OUTFEED=1" in process.stderr


def test_install_says_nothing_about_other_code(tmp_path):
  script = tmp_path / "program.py"
  script.write_text(OLD_BARRIER_CODE.replace("hcb.CallbackException",
                                             "ValueError"))
  process = subprocess.run([sys.executable, str(script)], capture_output=True,
                           text=True, timeout=120, check=False)
  assert process.returncode == 0 and process.stderr == "", process.stderr
