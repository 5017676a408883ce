"""The docs build without warnings, and every Python example in them runs.

Conventions in docs/*.md (benchmarks.md, which is generated, is not checked):

- Every fenced ```python block runs. The blocks of one page run in order, in
  one fresh interpreter with 4 CPU devices and the transport under test, so a
  block may use names defined by an earlier block of the same page.
- A ```text block that follows a ```python block (blank lines apart) is the
  output that block prints; it must match exactly (trailing spaces ignored).
- An HTML comment on the line before a ```python block changes this:
  `<!-- test: any-order -->` compares the lines of its output in any order
  (for output from several devices); `<!-- test: skip -->` does not run it;
  `<!-- test: requires NAME -->` runs it only when the dotted NAME (a module or
  an attribute, e.g. `host_callback.install`) exists.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import List, Optional

import pytest

import host_callback

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = {"benchmarks.md"}
PAGE_TIMEOUT_SECONDS = 300
MARKER = "----- host_callback docs test: end of block -----"

_FENCE = re.compile(r"^(`{3,})\s*([^`\s]*)[^`]*$")
_DIRECTIVE = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")


@dataclasses.dataclass
class Block:
  """A ```python block, and the output the page shows for it."""
  page: str
  line: int  # the line of the block's first code line, from 1
  code: str
  expected: Optional[str] = None
  any_order: bool = False
  skip: Optional[str] = None  # why the block does not run


def _exists(dotted: str) -> bool:
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      value = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    try:
      functools.reduce(getattr, parts[i:], value)
    except AttributeError:
      return False
    return True
  return False


def parse_page(path: pathlib.Path) -> List[Block]:
  """The python blocks of a Markdown page, with their expected outputs."""
  lines = path.read_text().splitlines()
  blocks: List[Block] = []
  directives: List[str] = []
  last_python: Optional[Block] = None  # a block that output may follow
  i = 0
  while i < len(lines):
    line = lines[i]
    fence = _FENCE.match(line)
    directive = _DIRECTIVE.match(line.strip())
    if directive:
      directives.append(directive.group(1))
      i += 1
      continue
    if not fence:
      if line.strip():
        last_python = None
        directives = []
      i += 1
      continue
    ticks, language = fence.groups()
    end = next((j for j in range(i + 1, len(lines))
                if lines[j].rstrip() == ticks), None)
    assert end is not None, f"{path.name}:{i + 1}: unclosed code fence"
    body = "\n".join(lines[i + 1:end])
    if language == "python":
      block = Block(path.name, i + 2, body)
      for d in directives:
        if d == "skip":
          block.skip = "marked skip"
        elif d == "any-order":
          block.any_order = True
        elif d.startswith("requires "):
          name = d.removeprefix("requires ").strip()
          if not _exists(name):
            block.skip = f"{name} does not exist"
        else:
          raise AssertionError(f"{path.name}:{i}: unknown directive {d!r}")
      blocks.append(block)
      last_python = block
    elif language == "text" and last_python is not None:
      last_python.expected = body
      last_python.any_order |= "any-order" in directives
      last_python = None
    else:
      last_python = None
    directives = []
    i = end + 1
  return blocks


def pages() -> List[pathlib.Path]:
  return sorted(p for p in DOCS.glob("*.md") if p.name not in GENERATED)


def pages_with_code() -> List[pathlib.Path]:
  return [p for p in pages() if parse_page(p)]


# Runs each block of a page in one namespace and prints MARKER after each.
_DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1])):
  source = "\\n" * (block["line"] - 1) + block["code"]
  exec(compile(source, block["page"], "exec"), namespace)
  print(%r, flush=True)
""" % MARKER


def _normalize(text: str) -> List[str]:
  return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize("page", pages_with_code(), ids=lambda p: p.name)
def test_code_examples(page, transport, tmp_path):
  blocks = [b for b in parse_page(page) if b.skip is None]
  (tmp_path / "blocks.json").write_text(
      json.dumps([dataclasses.asdict(b) for b in blocks]))
  env = dict(os.environ)
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  env["JAX_HOST_CALLBACK_TRANSPORT"] = transport
  env.setdefault("JAX_PLATFORMS", "cpu")
  process = subprocess.run(
      [sys.executable, "-c", _DRIVER, str(tmp_path / "blocks.json")],
      cwd=tmp_path, env=env, capture_output=True, text=True,
      timeout=PAGE_TIMEOUT_SECONDS)
  *completed, rest = process.stdout.split(MARKER + "\n")
  for block, output in zip(blocks, completed):
    if block.expected is None:
      continue
    expected, actual = _normalize(block.expected), _normalize(output)
    if block.any_order:
      expected, actual = sorted(expected), sorted(actual)
    assert actual == expected, (
        f"{page.name}:{block.line}: the block printed\n{output}\ninstead of\n"
        f"{block.expected}")
  if len(completed) < len(blocks):
    pytest.fail(
        f"{page.name}:{blocks[len(completed)].line}: the block failed; it "
        f"printed\n{rest}\n--- stderr:\n{process.stderr[-5000:]}")
  assert process.returncode == 0, process.stderr[-5000:]
  assert not rest.strip(), (
      f"{page.name}: printed after its last block (a tap not waited for with "
      f"barrier_wait?):\n{rest}")


def test_every_example_is_checked():
  """No python block hides from the checker (indented, or in another form)."""
  for page in pages():
    text = page.read_text()
    assert not re.search(r"^[ \t]+```\s*python", text, re.M), page.name
    assert "```{code-block} python" not in text, page.name
    assert ">>>" not in text, f"{page.name}: use ```python blocks"


def test_api_reference_lists_every_public_name():
  """In the autodoc block, and in the Markdown table that GitHub shows."""
  text = (DOCS / "api.md").read_text()
  table, autodoc = text.split("```{eval-rst}")
  for name in host_callback.__all__:
    assert f"host_callback.{name}" in autodoc, name
    assert f"`{name}" in table, name


@functools.lru_cache(maxsize=None)
def _sphinx_build(out_dir: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
       "html", "-d", os.path.join(out_dir, ".doctrees"), str(DOCS), out_dir],
      capture_output=True, text=True, timeout=PAGE_TIMEOUT_SECONDS)


@pytest.fixture(scope="module")
def html_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("docs_html")


def test_sphinx_build(html_dir):
  """`sphinx-build -W -b html docs` succeeds: warnings are errors."""
  import myst_parser, sphinx  # noqa: F401  (from the [test] extra: no skip)
  process = _sphinx_build(str(html_dir))  # built once for all transports
  assert process.returncode == 0, process.stdout + process.stderr
  guide = (html_dir / "user_guide.html").read_text()
  assert 'id="performance"' in guide
  api = (html_dir / "api.html").read_text()
  for name in host_callback.__all__:
    assert f'id="host_callback.{name}"' in api, name


def _marked_text(text: str, marker: str) -> str:
  match = re.search(rf"<!-- test: {marker} -->\n```text\n(.*?)\n```", text,
                    re.S)
  assert match, f"no ```text block marked {marker}"
  return match.group(1) + "\n"


def test_codemod_example(tmp_path):
  """The migration guide's before/after is what the codemod does."""
  import libcst  # noqa: F401  (from the [test] extra: no skip)
  text = (DOCS / "migration.md").read_text()
  path = tmp_path / "old_code.py"
  path.write_text(_marked_text(text, "codemod-input"))
  process = subprocess.run(
      [sys.executable, "-m", "host_callback.migrate", str(path)],
      capture_output=True, text=True, timeout=PAGE_TIMEOUT_SECONDS)
  assert process.returncode == 0, process.stdout + process.stderr
  assert path.read_text() == _marked_text(text, "codemod-output")


# A time or a ratio: "12x", "1.5×", "20.5 µs", "0.5 ms", a range "30-80 µs"
# (not "16x16").
_FIGURE = r"(?<![\w.]){}(?!\w)"
_STATED = _FIGURE.format(r"\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?"
                         r"(?:x|×| µs| ms)")
# Design constants that a page may state beside their names: they are
# settings of the code, not measurements.
_CONSTANTS = {"kBatchInterval": "2 ms", "kGuestGrace": "200 µs",
              "kPollInterval": "50 ms"}


def _sources_of_numbers() -> str:
  """The pages measured figures come from: the benchmark page (CPU, one
  run of `python -m tools.bench --write docs`) and the GPU page."""
  return (DOCS / "benchmarks.md").read_text() + (DOCS / "gpu.md").read_text()


def _unsourced(text: str, sources: str) -> List[str]:
  """The figures `text` states that `sources` does not hold."""
  missing = []
  for line in text.splitlines():
    allowed = {value for name, value in _CONSTANTS.items() if name in line}
    missing += [number for number in re.findall(_STATED, line)
                if number not in allowed and not re.search(
                    _FIGURE.format(re.escape(number)), sources)]
  return missing


def _pages_and_docstrings() -> List[pathlib.Path]:
  """Every page a user or contributor reads, and the package's sources
  (docstrings and comments)."""
  sources = {"benchmarks.md", "gpu.md"}
  return ([ROOT / "README.md"]
          + [p for p in sorted(DOCS.glob("*.md")) if p.name not in sources]
          + sorted((ROOT / "host_callback").rglob("*.py"))
          + sorted((ROOT / "receiver").rglob("*.py")))


@pytest.mark.parametrize("path", _pages_and_docstrings(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stated_number_is_on_the_benchmark_pages(path):
  """A time or ratio that README.md, docs/ or the package's docstrings state
  is a figure of docs/benchmarks.md or docs/gpu.md, each from one run: no
  page keeps a number of its own, to drift from the measurements."""
  assert _unsourced(path.read_text(), _sources_of_numbers()) == []


def test_readme_numbers_are_in_the_benchmark_summary():
  """Every time and ratio the README states is a figure of the summary of
  docs/benchmarks.md, which is generated from one run."""
  readme = (ROOT / "README.md").read_text()
  page = (DOCS / "benchmarks.md").read_text()
  summary = page.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
  figure = r"(?<![\w.]){}(?!\w)"
  stated = re.findall(figure.format(r"\d+(?:\.\d+)?(?:x| µs| ms)"), readme)
  assert len(stated) >= 10, stated
  assert [number for number in stated if not re.search(
      figure.format(re.escape(number)), summary)] == []


def test_benchmarks_page_is_the_writer_s():
  """docs/benchmarks.md opens with the summary, then has a table per topic
  with only the columns that have values."""
  page = (DOCS / "benchmarks.md").read_text()
  titles = re.findall(r"^## (.*)$", page, flags=re.M)
  assert titles[0] == "Summary" and titles[-1] == "barrier_wait", titles
  for table in re.findall(r"^\| scenario \|.*\n\|[-|]*\n((?:\|.*\n)+)", page,
                          flags=re.M):
    columns = zip(*[line.strip("|\n").split("|")
                    for line in table.splitlines()])
    assert all(any(cell.strip() for cell in column) for column in columns)


def test_every_documented_import_path_resolves():
  """Every `host_callback.…` name the README and the docs give (the API
  reference's autodoc entries among them) imports: the public paths
  outlive the package's own layout."""
  named = set()
  for page in [ROOT / "README.md", *pages()]:
    named.update(re.findall(r"\bhost_callback(?:\.[A-Za-z_]\w*)+",
                            page.read_text()))
  named.discard("host_callback.receiver._native")  # built, not always there
  assert "host_callback.tqdm.scan_tqdm" in named
  unresolved = [name for name in sorted(named) if not _exists(name)]
  assert unresolved == []
