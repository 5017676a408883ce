"""The codemod `python -m host_callback.migrate` on the samples in
tests/data/migrate: input/ is old code, expected/ what the codemod makes of it.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import host_callback
from host_callback import migrate

DATA = Path(__file__).parent / "data" / "migrate"
INPUT, EXPECTED = DATA / "input", DATA / "expected"
TOOLS_MIGRATE = Path(__file__).parent.parent / "tools" / "migrate.py"
IPYTHON_LINE = ("IPython syntax (magic, shell escape or help) left unchanged: "
                "check it by hand")


@pytest.fixture(autouse=True)
def transport():
  """Overrides conftest's per-transport runs: no test here uses a transport."""
  yield None


@pytest.fixture
def tree(tmp_path: Path) -> Path:
  """A copy of the input samples, to be rewritten."""
  return Path(shutil.copytree(INPUT, tmp_path / "tree"))


def files(directory: Path) -> dict[str, bytes]:
  return {str(path.relative_to(directory)): path.read_bytes()
          for path in sorted(directory.rglob("*")) if path.is_file()}


def reports(stderr: str) -> list[str]:
  """The `file:line: message` lines, without the closing summary."""
  return [line for line in stderr.splitlines() if "place(s)" not in line]


def test_rewrites_every_sample_as_expected(tree, capsys):
  assert migrate.main([str(tree)]) == 0
  assert files(tree) == files(EXPECTED)
  out, err = capsys.readouterr()
  assert out.splitlines() == [f"rewrote {tree / name}" for name in [
      "imports.py", "notebook.ipynb", "plain_import.py",
      "plain_import_chains_only.py", "reports.py"]]
  assert "5 file(s) rewritten, 20 place(s) to check by hand" in err


def test_second_run_changes_nothing(tree, capsys):
  assert migrate.main([str(tree)]) == 0
  capsys.readouterr()
  assert migrate.main(["--check", str(tree)]) == 0
  out, err = capsys.readouterr()
  assert out == ""
  assert "0 file(s) would be rewritten" in err
  assert migrate.main([str(tree)]) == 0
  assert files(tree) == files(EXPECTED)


def test_check_prints_a_diff_and_writes_nothing(tree, capsys):
  assert migrate.main(["--check", str(tree)]) == 1
  out, err = capsys.readouterr()
  assert files(tree) == files(INPUT)
  assert f"--- a/{tree / 'imports.py'}\n+++ b/{tree / 'imports.py'}\n" in out
  assert ("-from jax.experimental import host_callback as hcb  # the usual "
          "one\n-from jax.experimental import host_callback\n"
          "+import host_callback as hcb  # the usual one\n"
          "+import host_callback\n") in out
  assert "unchanged.py" not in out
  assert "5 file(s) would be rewritten, 20 place(s) to check by hand" in err


def test_check_on_nothing_to_change(capsys):
  assert migrate.main(["--check", str(INPUT / "unchanged.py")]) == 0
  out, err = capsys.readouterr()
  assert out == ""
  assert reports(err) == []


def test_plain_import_adds_import_jax_only_when_jax_is_read():
  plain = migrate.migrate_source((INPUT / "plain_import.py").read_text())
  assert plain.code.startswith('"""`import jax.experimental.host_callback` '
                               'also bound the name `jax`."""\n'
                               "import jax\n"
                               "import host_callback  # for the taps\n")
  only_chains = migrate.migrate_source(
      "import jax.experimental.host_callback\n"
      "jax.experimental.host_callback.barrier_wait()\n")
  assert only_chains.code == "import host_callback\n" \
      "host_callback.barrier_wait()\n"
  with_jax = migrate.migrate_source(
      "import jax\nimport jax.experimental.host_callback\n"
      "jax.jit(jax.experimental.host_callback.barrier_wait)\n")
  assert with_jax.code == "import jax\nimport host_callback\n" \
      "jax.jit(host_callback.barrier_wait)\n"


@pytest.mark.parametrize("old, new", [
    ("from jax.experimental import host_callback as foo\n",
     "import host_callback as foo\n"),
    ("import jax.experimental.host_callback as foo\n",
     "import host_callback as foo\n"),
    ("from jax.experimental.host_callback import id_tap as t, call\n",
     "from host_callback import id_tap as t, call\n"),
    ("from jax.experimental import pjit, host_callback\n",
     "from jax.experimental import pjit\nimport host_callback\n"),
    ("if x: from jax.experimental import host_callback, pjit\n",
     "if x: from jax.experimental import pjit; import host_callback\n"),
    ("from jax.experimental import (\n    pjit,\n    host_callback,\n)\n",
     "from jax.experimental import (\n    pjit,\n)\nimport host_callback\n"),
    ("import host_callback as hcb\n", "import host_callback as hcb\n"),
    ("from jax.experimental import pjit\n",
     "from jax.experimental import pjit\n"),
    ("from .jax.experimental import host_callback\n",
     "from .jax.experimental import host_callback\n"),
])
def test_import_forms(old, new):
  assert migrate.migrate_source(old).code == new
  assert migrate.migrate_source(new).code == new


def test_keeps_line_endings():
  crlf = "import os\r\nfrom jax.experimental import host_callback, pjit\r\n"
  assert migrate.migrate_source(crlf).code == (
      "import os\r\nfrom jax.experimental import pjit\r\n"
      "import host_callback\r\n")


def test_reports(capsys):
  path = INPUT / "reports.py"
  assert migrate.main(["--check", str(path)]) == 1
  assert reports(capsys.readouterr().err) == [f"{path}:{line}" for line in [
      "7: `_deprecated_id_tap` is private to the old module and "
      "host_callback has no equivalent; rewrite this by hand",
      "10: setting `jax_host_callback_legacy` is not supported: host_callback "
      "always behaves as the legacy implementation; remove it",
      "11: setting `jax_host_callback_ad_transforms` is not supported: under "
      "jvp/grad host_callback taps primal values only and adds no "
      "'jvp'/'transpose' entries to `transforms`; remove it",
      "16: id_tap no longer passes keyword arguments (what=) to the tap "
      "function and raises TypeError; pre-apply them with functools.partial "
      "or a closure",
      "17: id_tap no longer passes keyword arguments (nr=) to the tap "
      "function and raises TypeError; pre-apply them with functools.partial "
      "or a closure",
      "18: id_tap(..., **kwargs): check that only result=, tap_with_device= "
      "and device_index= are passed",
      "21: `hcb._initialize_outfeed_receiver` is private to the old module "
      "and host_callback has no equivalent; rewrite this by hand",
      "22: the string 'jax.experimental.host_callback.id_tap' names the old "
      "module (for mock.patch?); change it to host_callback by hand",
      "24: `jax.experimental.host_callback` is used here but not imported as "
      "such; import host_callback and use it instead",
  ]]


def test_reports_name_what_is_missing():
  source = ("import jax.experimental as jex\n"
            "from jax import experimental\n"
            "from jax.experimental.host_callback import id_tap as tap\n"
            "jex.host_callback.id_tap(f, x)\n"
            "experimental.host_callback.id_tap(f, x)\n"
            "tap(f, x, result=1, tap_with_device=True, device_index=0)\n"
            "jax.config.update('jax_host_callback_wrong', 1)\n"
            "hcb.id_tap(f, x, what=1)  # hcb was never imported: no report\n"
            "import jax.experimental.host_callback as h\n"
            "print(h.__name__, h.id_print(x, what=1))\n")
  assert [(report.line, report.message[:40])
          for report in migrate.migrate_source(source).reports] == [
              (4, "`jex.host_callback`: import host_callbac"),
              (5, "`experimental.host_callback`: import hos"),
              (7, "setting `jax_host_callback_wrong` is not"),
          ]


def test_static_lists_are_the_package_s():
  """migrate lists the public names and settings instead of importing the
  runtime to read them: they must stay what the package provides."""
  assert migrate.PUBLIC_NAMES == set(host_callback.__all__)
  assert len(host_callback.__all__) == len(migrate.PUBLIC_NAMES)
  # `import host_callback` registered the settings.
  assert migrate.SUPPORTED_SETTINGS == {
      name for name in jax.config.values
      if name.startswith("jax_host_callback_")}


def test_supported_settings_are_not_reported():
  source = "".join(f"jax.config.update('{name}', x)\n{name.upper()}=1\n"
                   for name in migrate.SUPPORTED_SETTINGS)
  assert migrate.migrate_source(source).reports == ()


def test_notebook_json_is_unchanged_but_for_the_rewritten_lines():
  old = (INPUT / "notebook.ipynb").read_text(encoding="utf-8")
  new = old
  for before, after in [
      ('"from jax.experimental import host_callback as hcb  # old API"',
       '"import host_callback as hcb  # old API"'),
      ('"from jax.experimental.host_callback import id_tap, barrier_wait\\n"',
       '"from host_callback import id_tap, barrier_wait\\n"'),
      ('"import jax.experimental.host_callback\\n",\n'
       '    "jax.experimental.host_callback.barrier_wait()\\n"',
       '"import host_callback\\n",\n    "host_callback.barrier_wait()\\n"'),
      ('"source": "from jax.experimental import host_callback\\n',
       '"source": "import host_callback\\n'),
  ]:
    assert old.count(before) == 1, before
    new = new.replace(before, after)
  assert migrate.migrate_notebook(old).code == new
  assert (EXPECTED / "notebook.ipynb").read_text(encoding="utf-8") == new
  cells = json.loads(new)["cells"]
  assert cells[1]["source"][-1] == "import host_callback as hcb  # old API"
  assert isinstance(cells[6]["source"], str)


def test_notebook_reports_point_into_the_json():
  text = (INPUT / "notebook.ipynb").read_text(encoding="utf-8")
  lines = text.splitlines()
  got = migrate.migrate_notebook(text).reports
  assert [(report.line, report.message) for report in got] == [
      (20, f"cell 2, line 1: {IPYTHON_LINE}"),
      (21, f"cell 2, line 2: {IPYTHON_LINE}"),
      (36, f"cell 3, line 4: {IPYTHON_LINE}"),
      (38, f"cell 3, line 6: {IPYTHON_LINE}"),
      # `hcb` comes from the import in cell 2: cells share one namespace.
      (39, "cell 3, line 7: id_tap no longer passes keyword arguments (what=) "
       "to the tap function and raises TypeError; pre-apply them with "
       "functools.partial or a closure"),
      (40, f"cell 3, line 8: {IPYTHON_LINE}"),
      (41, f"cell 3, line 9: {IPYTHON_LINE}"),
      (51, f"cell 4, line 1: {IPYTHON_LINE}"),
      (63, "cell 5, line 1: cell magic `%%bash` whose body is not Python: "
       "cell left unchanged"),
      (64, "cell 5, line 2: setting `JAX_HOST_CALLBACK_LEGACY` is not "
       "supported: host_callback always behaves as the legacy "
       "implementation; remove it"),
      (100, "cell 7, line 2: setting `jax_host_callback_ad_transforms` is "
       "not supported: under jvp/grad host_callback taps primal values only "
       "and adds no 'jvp'/'transpose' entries to `transforms`; remove it"),
  ]
  assert lines[19].strip() == '"!pip install jax\\n",'
  assert lines[38].strip() == '"    hcb.id_tap(show, i, what=i)\\n",'


def test_cells_share_one_namespace():
  cells = ["import jax.experimental.host_callback\n",
           "%time jax.experimental.host_callback.barrier_wait()\n"
           "jax.experimental.host_callback.barrier_wait()\n",
           "x = jax.numpy.ones(3)\n"]
  assert [migration.code for migration in migrate.migrate_cells(cells)] == [
      "import jax\nimport host_callback\n",
      "%time jax.experimental.host_callback.barrier_wait()\n"
      "host_callback.barrier_wait()\n",
      "x = jax.numpy.ones(3)\n"]


def test_cell_that_parses_is_not_masked():
  cell = ('doc = """\n%d items\n!important\n"""\n'
          "import jax.experimental.host_callback as h\n")
  [migration] = migrate.migrate_cells([cell])
  assert migration.code == cell.replace("jax.experimental.host_callback",
                                        "host_callback")
  assert migration.reports == ()


def test_cell_that_never_parses_is_left_whole():
  cell = "from jax.experimental import host_callback as hcb\ndef f(:\n"
  [migration] = migrate.migrate_cells([cell])
  assert migration.code == cell
  assert migration.reports == (
      migrate.Report(1, "cannot parse this cell: cell left unchanged"),)


def test_unparsable_file_is_an_error(tmp_path, capsys):
  (tmp_path / "bad.py").write_text("from jax.experimental import "
                                   "host_callback\ndef f(:\n")
  good = tmp_path / "good.py"
  good.write_text("from jax.experimental import host_callback\n")
  (tmp_path / "bad.ipynb").write_text("{not json")
  (tmp_path / "list.ipynb").write_text("[]")
  assert migrate.main([str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert f"{tmp_path / 'bad.py'}: error: cannot parse (" in err
  assert f"{tmp_path / 'bad.ipynb'}: error: not a notebook: " in err
  assert f"{tmp_path / 'list.ipynb'}: error: not a notebook: " in err
  assert good.read_text() == "import host_callback\n"
  assert migrate.main([str(tmp_path / "missing.py")]) == 2


def test_directory_search_skips_hidden_caches_and_virtualenvs(tmp_path):
  for name in ["a.py", "b.ipynb", "c.txt", "sub/d.py", ".git/e.py",
               "__pycache__/f.py", "venv/g.py", "venv/pyvenv.cfg",
               "lib/site-packages/h.py", "node_modules/i.py"]:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("")
  assert [str(path.relative_to(tmp_path))
          for path in migrate.iter_sources([tmp_path])] == [
              "a.py", "b.ipynb", "sub/d.py"]
  explicit = tmp_path / "c.txt"
  assert list(migrate.iter_sources([explicit])) == [explicit]


def run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, timeout=120, check=False)


def test_command_lines(tree):
  """`python -m host_callback.migrate` and the tools/migrate.py wrapper."""
  process = run("-m", "host_callback.migrate", "--check", str(tree))
  assert process.returncode == 1, process.stderr
  assert process.stdout.startswith("--- a/")
  process = run(str(TOOLS_MIGRATE), str(tree))
  assert process.returncode == 0, process.stderr
  assert files(tree) == files(EXPECTED)


def _imported_modules(importtime_stderr: str) -> set[str]:
  """The modules a `python -X importtime` run imported."""
  return {line.rpartition("|")[2].strip()
          for line in importtime_stderr.splitlines()
          if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["--check", "old.py"]])
def test_codemod_does_not_import_the_runtime(tmp_path, args):
  (tmp_path / "old.py").write_text(
      "from jax.experimental import host_callback as hcb\n"
      "hcb.id_print(1)\n")
  process = subprocess.run(
      [sys.executable, "-X", "importtime", "-m", "host_callback.migrate",
       *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
      check=False)
  if args[0] == "--help":
    assert process.returncode == 0, process.stderr
    assert process.stdout.startswith("usage: python -m host_callback.migrate")
  else:
    assert process.returncode == 1, process.stderr  # it would rewrite old.py
    assert "+import host_callback as hcb" in process.stdout
  imported = _imported_modules(process.stderr)
  assert {"host_callback", "libcst"} <= imported
  runtime = ("host_callback.api", "host_callback.host.host_side",
             "host_callback.primitive.primitive", "host_callback.receiver")
  assert sorted(name for name in imported if name.startswith(runtime)) == []


def test_public_names_load_on_first_use():
  """`import host_callback` defers the runtime yet registers the settings;
  every name in `__all__` loads, by attribute and by `from ... import`."""
  code = """
import sys
import jax
import host_callback as hcb
jax.config.update("jax_host_callback_inline", False)
assert "host_callback.api" not in sys.modules
assert "host_callback.receiver" not in sys.modules
assert set(hcb.__all__) <= set(dir(hcb))
from host_callback import *
assert hcb.id_tap is id_tap and hcb.install is install
assert TapFunctionException is CallbackException is hcb.CallbackException
for name in hcb.__all__:
  assert callable(getattr(hcb, name)), name
from host_callback.receiver import CallbackException as original
assert CallbackException is original
try:
  hcb.no_such_name
except AttributeError as error:
  assert "no_such_name" in str(error)
else:
  raise AssertionError("hcb.no_such_name")
"""
  process = run("-c", code)
  assert process.returncode == 0, process.stderr


def test_without_libcst_says_what_to_install(tree):
  block = "import sys; sys.modules['libcst'] = None; "
  process = run("-c", block + "import runpy; sys.argv[1:] = ['x.py']; "
                "runpy.run_module('host_callback.migrate', "
                "run_name='__main__')")
  assert process.returncode == 2
  assert process.stderr == migrate.MISSING_LIBCST + "\n"
  process = run("-c", block + "import host_callback.migrate")
  assert process.stderr.endswith(
      f"ModuleNotFoundError: {migrate.MISSING_LIBCST}\n")


def test_reports_code_that_expects_errors_at_the_barrier():
  """A `barrier_wait()` in a `try` that catches CallbackException (or its
  alias, alone or in a tuple, by any name) expects the outfeed mode: the
  report names the setting. Other handlers are not reported."""
  source = ("from jax.experimental import host_callback as hcb\n"
            "from jax.experimental.host_callback import TapFunctionException\n"
            "try:\n"
            "  hcb.barrier_wait()\n"
            "except hcb.CallbackException:\n"
            "  pass\n"
            "try:\n"
            "  step()\n"
            "  hcb.barrier_wait('epoch')\n"
            "except (ValueError, TapFunctionException):\n"
            "  pass\n"
            "try:\n"
            "  hcb.barrier_wait()\n"
            "except Exception:\n"
            "  pass\n")
  reports = migrate.migrate_source(source).reports
  assert [(report.line, report.message.split(":")[0]) for report in reports
          ] == [(4, "barrier_wait() in a try that catches CallbackException"),
                (9, "barrier_wait() in a try that catches "
                 "TapFunctionException")]
  assert all("set JAX_HOST_CALLBACK_OUTFEED=1 (or jax.config.update("
             "'jax_host_callback_outfeed', True))" in report.message
             for report in reports)
  cell = migrate.migrate_cells(["import jax.experimental.host_callback as h\n"
                                "%time x = 1\n"
                                "try:\n  h.barrier_wait()\n"
                                "except h.CallbackException:\n  pass\n"])[0]
  assert [report.line for report in cell.reports] == [2, 4]
