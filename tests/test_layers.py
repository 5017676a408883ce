"""host_callback's modules import one another top-down, as
docs/architecture.md ("Layers") draws them: no import cycle, not even one
made of imports inside functions."""

from __future__ import annotations

import ast
import re
import pathlib
import subprocess
import sys
import textwrap
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "host_callback"


def _module_name(path: pathlib.Path) -> str:
  """`host/host_side.py` -> 'host.host_side'; a package's __init__ is the
  package."""
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Dict[str, pathlib.Path]:
  return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports() -> Dict[str, Set[str]]:
  """Each module's imports of the package's other modules, at any depth in
  its code, by dotted name below host_callback ('host.host_side')."""
  modules = _modules()
  graph: Dict[str, Set[str]] = {}
  for name, path in modules.items():
    deps = graph.setdefault(name, set())
    package = name.split(".") if path.name == "__init__.py" else (
        name.split(".")[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
      if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
        continue
      base = package[:len(package) - node.level + 1]
      target = ".".join(base + (node.module.split(".") if node.module else []))
      for alias in node.names:
        imported = f"{target}.{alias.name}" if target else alias.name
        deps.add(imported if imported in modules else target)
    deps.discard(name)
    deps.discard("")
  return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
  cycles = []

  def visit(module: str, path: List[str]) -> None:
    for dep in sorted(graph.get(module, ())):
      if dep in path:
        cycles.append(path[path.index(dep):] + [dep])
      elif len(path) < len(graph):
        visit(dep, path + [dep])

  for module in sorted(graph):
    visit(module, [module])
  return cycles


def test_modules_import_each_other_without_cycles():
  assert _cycles(_imports()) == []


def test_runtime_barrier_and_primitive_read_top_down():
  graph = _imports()
  assert "barrier.barrier" not in graph["host.host_side"]
  assert "barrier.barrier" not in graph["primitive.primitive"]
  assert "primitive.primitive" in graph["barrier.barrier"]
  assert "primitive.eager" in graph["primitive.primitive"]
  assert "host.host_side" in graph["primitive.eager"]


def test_the_parts_import_downward():
  """The subpackages read as the architecture doc draws them: the host side
  knows neither the primitive nor the barrier nor the bars; the primitive
  neither the barrier nor the bars; the barrier not the bars."""
  below = {"host": ("primitive", "barrier", "bars", "api"),
           "primitive": ("barrier", "bars", "api"),
           "barrier": ("bars", "api")}
  for module, deps in _imports().items():
    part = module.split(".")[0]
    upward = [d for d in deps if d.split(".")[0] in below.get(part, ())]
    assert upward == [], (module, upward)


def test_each_module_imports_alone_and_taps_drain_at_exit(transport):
  """Any of them can be imported first; the drain at exit still runs."""
  for module in ("host.host_side", "barrier.barrier", "primitive.primitive",
                 "primitive.lowering"):
    code = textwrap.dedent(f"""
        import host_callback.{module}
        import jax, jax.numpy as jnp
        import host_callback as hcb
        jax.config.update("jax_host_callback_transport", {transport!r})
        jax.config.update("jax_host_callback_outfeed", True)
        hcb.id_tap(lambda a, t: print("tapped", int(a), flush=True),
                   jnp.int32(3))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "tapped 3\n", (module, done.stdout, done.stderr)


def test_the_adapter_exports_every_name_the_package_uses():
  """`_jax_adapter.__all__` lists what the other modules take from it."""
  from host_callback import _jax_adapter  # pylint: disable=import-outside-toplevel
  used = set()
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Attribute) and
          isinstance(node.value, ast.Name) and node.value.id == "adapter"):
        used.add(node.attr)
      elif (isinstance(node, ast.ImportFrom) and
            node.module and node.module.endswith("_jax_adapter")):
        used.update(alias.name for alias in node.names)
  assert used and used <= set(_jax_adapter.__all__), sorted(
      used - set(_jax_adapter.__all__))


def test_the_jax_side_reaches_the_native_module_through_its_transport():
  """host_callback/ imports receiver.transport_native, never the native
  library itself."""
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module == "receiver":
        names = {alias.name for alias in node.names}
        assert "native_library" not in names, path.name


def test_every_patch_of_jax_is_listed_and_installed():
  """`_jax_adapter.PATCHES` lists each patch of JAX's internals with the
  versions it was checked against, and importing the package installs
  each one."""
  import host_callback.primitive.primitive  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from host_callback import _jax_adapter  # pylint: disable=import-outside-toplevel
  from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel
  from jax._src.lax.control_flow import loops  # pylint: disable=import-outside-toplevel
  assert len(_jax_adapter.PATCHES) == 4
  assert all(len(patch) == 3 and all(patch) for patch in _jax_adapter.PATCHES)
  assert pxla._cached_lowering_to_hlo._host_callback_rewrite
  assert pxla._cached_compilation._host_callback_retry
  assert loops._scan_known_hoisting._host_callback_guard
  entry = _jax_adapter.mlir._lowerings[loops.while_p]
  # A LoweringRuleEntry in jax 0.10, the rule itself in earlier versions.
  assert getattr(entry, "rule", entry) is _jax_adapter._while_lowering


_EXTERNAL = ("jax/", "xla/")  # JAX's and XLA's own sources, named as such


def test_the_architecture_doc_s_file_references_resolve():
  """Each `file.ext` or `file.ext:Name` that docs/architecture.md names is
  one file of the repository, and holds the name."""
  root = PACKAGE.parent
  tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.splitlines()
  text = (root / "docs" / "architecture.md").read_text()
  unresolved = []
  for match in re.finditer(
      r"(?<![\w/.])([\w/]+\.(?:py|cc|h))(?!\w)(?::([A-Za-z_][\w:]*))?", text):
    path, name = match.groups()
    if path.startswith(_EXTERNAL):
      continue
    found = [f for f in tracked if f == path or f.endswith("/" + path)]
    if len(found) != 1:
      unresolved.append(f"{path}: {len(found)} files")
    elif name and name.split(":")[-1] not in (root / found[0]).read_text():
      unresolved.append(f"{path}:{name}: no such name there")
  assert unresolved == []


def test_no_runs_of_blank_lines():
  """At most two blank lines in a row in the package's and tools' code."""
  root = PACKAGE.parent
  runs = [str(path.relative_to(root))
          for folder in ("host_callback", "receiver", "tools")
          for path in (root / folder).rglob("*.py")
          if "\n\n\n\n" in path.read_text()]
  assert runs == []


def test_the_loop_lens_taps_through_the_one_internal_entry():
  """host_callback/loops/ makes no host function and binds no primitive
  itself: its taps go through `api.consumer_tap` (in emission.py alone),
  the one maker of a host function with `int_operands`; outside host/,
  primitive/ and api.py only the barrier's markers make a host function
  (of a kind of `host_functions.KINDS`)."""
  from host_callback.host import host_functions  # pylint: disable=import-outside-toplevel
  maker = re.compile(r"\b(?:%s)\(" % "|".join(
      kind.__name__ for kind in host_functions.KINDS))
  for module, deps in _imports().items():
    if module.split(".")[0] == "loops":
      back_doors = [d for d in deps if d.split(".")[0] == "primitive"
                    or d in ("host.host_functions", "host.host_side",
                             "receiver.native_library")]
      assert back_doors == [], (module, back_doors)
  makers, entries, int_setters = set(), set(), set()
  for path in PACKAGE.rglob("*.py"):
    text = path.read_text()
    where = str(path.relative_to(PACKAGE))
    if maker.search(text):
      makers.add(where)
    if re.search(r"\bconsumer_tap\(", text):
      entries.add(where)
    if re.search(r"\bint_operands=", text):
      int_setters.add(where)
  assert {m for m in makers
          if not m.startswith(("host/", "primitive/"))} == {
              "api.py", "barrier/barrier.py"}
  assert entries == {"api.py", "loops/emission.py"}
  # api.consumer_tap alone makes a host function with int_operands.
  assert int_setters == {"api.py", "loops/emission.py"}


def test_the_loop_lens_uses_consumer_tap(monkeypatch):
  """What the lens sends, it sends through `api.consumer_tap`."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from host_callback import api  # pylint: disable=import-outside-toplevel
  from host_callback import loops  # pylint: disable=import-outside-toplevel
  taps, events = [], []
  entry = api.consumer_tap

  def counted(consume, operands, **kwargs):
    taps.append(kwargs["int_operands"])
    return entry(consume, operands, **kwargs)

  monkeypatch.setattr(api, "consumer_tap", counted)
  run = loops.verbose(lambda x: jax.lax.scan(
      lambda c, _: (c + 1.0, None), x, None, length=3)[0],
      on_step=events.append)
  assert float(run(jnp.float32(0))) == 3.0
  api.barrier_wait()
  assert taps == [(0,)]
  assert [event.step for event in events] == [0, 1, 2]


# What names the loop lens (host_callback/loops/) and its events.
_LENS_WORDS = re.compile(
    r"TapEvent|host_callback\.loops|loops/|\blens\b|loop tap|tap's step|"
    r"\bsite_events\b|\bLensOptions\b", re.IGNORECASE)
# Names (identifiers) of the lens's vocabulary.
_LENS_NAMES = re.compile(r"\b\w*(?:Step|step_|_step|Lens|lens_|TapEvent)\w*\b")


def test_the_receiver_knows_nothing_of_the_loop_lens():
  """receiver/ (Python and C++) neither names the loop lens nor its events
  in code, comments or docstrings: what makes the lens's events there is
  generic (`receiver/instances.py`), and which arrays come as Python ints
  is a site's `int_columns`."""
  receiver = PACKAGE.parent / "receiver"
  found = []
  for path in sorted(receiver.rglob("*")):
    if (path.suffix not in (".py", ".cc", ".h") or
        "third_party" in path.parts):
      continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
      if _LENS_WORDS.search(line) or _LENS_NAMES.search(line):
        found.append(f"{path.relative_to(receiver)}:{number}: {line.strip()}")
  assert found == []
