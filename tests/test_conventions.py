"""Ecosystem conventions: type checkers see the hints (PEP 561), the
package logs what it chose and did under the `host_callback` logger, has a
`__version__`, `python -m host_callback --help` says what it runs, and its
Python code runs unchanged where Linux's files and calls are missing."""

from __future__ import annotations

import logging
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import host_callback as hcb
from host_callback.host import transport_policy
from helpers import needs_cpu_default_backend

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_type_checkers_see_the_public_signatures(tmp_path):
  assert (ROOT / "host_callback" / "py.typed").is_file()
  snippet = tmp_path / "snippet.py"
  snippet.write_text("import host_callback as hcb\n"
                     "reveal_type(hcb.id_tap)\n"
                     "reveal_type(hcb.call)\n"
                     "reveal_type(hcb.barrier_wait)\n")
  # From the checkout's root, as an editable install's import hook is
  # invisible to mypy; a regular install finds py.typed in site-packages.
  checked = subprocess.run(
      [sys.executable, "-m", "mypy", "--follow-imports=silent",
       "--no-incremental", str(snippet)],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  revealed = [line for line in checked.stdout.splitlines()
              if "Revealed type" in line]
  assert len(revealed) == 3, checked.stdout + checked.stderr
  assert 'Revealed type is "def (tap_func: ' in revealed[0]
  assert 'Revealed type is "def (callback_func: ' in revealed[1]
  assert 'Revealed type is "def (logging_name: ' in revealed[2]


def test_logs_the_transport_the_receiver_and_barriers(caplog, transport,
                                                      outfeed_mode):
  needs_cpu_default_backend("checks the logs of the CPU transports")
  hcb.stop_outfeed_receiver()
  transport_policy._log_choice.cache_clear()  # logged once per choice
  caplog.set_level(logging.DEBUG, logger="host_callback")
  got = []
  jax.jit(lambda x: hcb.id_tap(lambda a, _: got.append(int(a)), x))(
      jnp.int32(7))
  hcb.barrier_wait("epoch 3")
  hcb.stop_outfeed_receiver()
  assert got == [7]
  messages = [record.getMessage() for record in caplog.records
              if record.name == "host_callback"]
  assert any(f"the {transport} transport is used on CPU" in message
             for message in messages), messages
  assert any("receiver started" in message for message in messages), messages
  start = messages.index("barrier_wait[epoch 3]: start")
  assert messages.index("barrier_wait[epoch 3]: done") > start
  assert "host_callback: receiver stopped" in messages
  assert any(f"{transport} queue of device 0: high water" in message
             for message in messages), messages


def test_version_is_the_installed_distribution_s():
  """One source: setup.cfg's version, as the installed metadata has it."""
  import configparser  # pylint: disable=import-outside-toplevel
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")
  assert hcb.__version__ == config["metadata"]["version"]
  assert hcb.__version__ == importlib.metadata.version("host-callback")


def _demo(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "host_callback", *args],
                        capture_output=True, text=True, timeout=300,
                        check=False)


def test_demo_help_describes_it_without_running_it(transport):
  if transport != "python":
    pytest.skip("the command line does not depend on the transport")
  shown = _demo("--help")
  assert shown.returncode == 0, shown.stderr
  assert shown.stdout.startswith("usage: python -m host_callback [-h]")
  assert "Runs a demo: a jitted training loop" in shown.stdout
  assert "host_callback demo on" not in shown.stdout  # it did not run
  version = _demo("--version")
  assert (version.returncode, version.stdout) == (
      0, f"host-callback {hcb.__version__}\n")


def _extras_in_setup_cfg() -> dict:
  """Each extra of setup.cfg: the names of the packages it adds."""
  import configparser  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  config = configparser.ConfigParser()
  config.read(pathlib.Path(__file__).parent.parent / "setup.cfg")
  return {extra: {re.split(r"[<>=!~ ;\[]", line.strip())[0].lower()
                  for line in lines.splitlines()
                  if line.strip() and not line.strip().startswith("#")}
          for extra, lines in config["options.extras_require"].items()}


def _extras_in_readme() -> dict:
  """Each extra of the README's table: the packages it says it adds, with
  those of the extras it names."""
  import re  # pylint: disable=import-outside-toplevel
  readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
  rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", readme, flags=re.M)
  listed = {}
  for extra, adds in rows:
    own, _, others = adds.partition(", and the ")
    listed[extra] = ({name.strip().lower() for name in own.split(",")},
                     re.findall(r"`(\w+)`", others))
  return {extra: set(names).union(*(listed[o][0] for o in others))
          for extra, (names, others) in listed.items()}


def test_readme_lists_the_extras_of_setup_cfg():
  """The README's table of extras says what setup.cfg installs."""
  assert _extras_in_readme() == _extras_in_setup_cfg()


# Linux's own files, and the calls of `os`, `signal` and `select` that macOS
# lacks.
_LINUX_ONLY = re.compile(
    r"/proc/|/sys/|sched_[a-z]*affinity|pipe2|eventfd|memfd_create|epoll|"
    r"posix_fadvise|sigtimedwait|SIGRTMIN")


def test_the_packages_python_code_needs_nothing_linux_only():
  """The shipped Python code (host_callback/, receiver/) reads no Linux-only
  file and makes no Linux-only call: on macOS only the native module's
  Linux-only calls differ, and they have portable branches
  (receiver/native/portability.h)."""
  found = [f"{path.relative_to(ROOT)}: {match.group()}"
           for folder in ("host_callback", "receiver")
           for path in sorted((ROOT / folder).rglob("*.py"))
           for match in _LINUX_ONLY.finditer(path.read_text())]
  assert not found
