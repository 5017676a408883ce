"""Rewriting: the imports of the old module, and the uses of its full name;
`migrate_source` runs the analysis and the rewrite on a Python file."""

from __future__ import annotations

from typing import Iterable, Sequence, Union

import libcst as cst
from libcst.metadata import MetadataWrapper

from .analysis import (Analyzer, Namespace, barrier_reports, chain_reports,
                       setting_reports, uses_name)
from .common import LEGACY_MODULE, NEW_MODULE, Migration, Report, dotted_name


def _new_import(aliases: Sequence[cst.ImportAlias]) -> cst.Import:
  """`import host_callback [as x], ...` keeping each alias's `as` part."""
  return cst.Import(names=[
      alias.with_changes(name=cst.Name(NEW_MODULE),
                         comma=cst.MaybeSentinel.DEFAULT)
      for alias in aliases])


def _last_comma(kept: Union[cst.Comma, cst.MaybeSentinel],
                last: Union[cst.Comma, cst.MaybeSentinel], parenthesized: bool
                ) -> Union[cst.Comma, cst.MaybeSentinel]:
  """The comma after the name that becomes last in an import list: none
  unless the list had a trailing comma in parentheses; then `kept`'s, with
  its comment but the line break that `last`'s comma had before `)`."""
  if not (parenthesized and isinstance(last, cst.Comma)
          and isinstance(kept, cst.Comma)):
    return cst.MaybeSentinel.DEFAULT
  before, after = kept.whitespace_after, last.whitespace_after
  if isinstance(before, cst.ParenthesizedWhitespace) and isinstance(
      after, cst.ParenthesizedWhitespace):
    after = before.with_changes(indent=after.indent, last_line=after.last_line)
  return kept.with_changes(whitespace_after=after)


class Rewriter(cst.CSTTransformer):
  """Rewrites the imports, and `jax.experimental.host_callback.x` chains
  when the file binds `host_callback`."""

  def __init__(self, rewrite_chains: bool, add_jax_import: bool) -> None:
    super().__init__()
    self._rewrite_chains = rewrite_chains
    self._add_jax_import = add_jax_import

  def visit_Import(self, node: cst.Import) -> bool:
    return False  # rewritten whole in _rewrite

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    return False

  def leave_Attribute(self, original_node: cst.Attribute,
                      updated_node: cst.Attribute) -> cst.BaseExpression:
    if self._rewrite_chains and dotted_name(updated_node) == LEGACY_MODULE:
      return cst.Name(NEW_MODULE, lpar=updated_node.lpar,
                      rpar=updated_node.rpar)
    return updated_node

  def leave_SimpleStatementLine(
      self, original_node: cst.SimpleStatementLine,
      updated_node: cst.SimpleStatementLine
  ) -> Union[cst.SimpleStatementLine,
             cst.FlattenSentinel[cst.SimpleStatementLine]]:
    body = [new for old in updated_node.body for new in self._rewrite(old)]
    if len(body) == len(updated_node.body) or len(updated_node.body) > 1:
      return updated_node.with_changes(body=body)
    # One statement became several: one line each, comments kept around them.
    lines = [cst.SimpleStatementLine(body=[statement]) for statement in body]
    lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
    lines[-1] = lines[-1].with_changes(
        trailing_whitespace=updated_node.trailing_whitespace)
    return cst.FlattenSentinel(lines)

  def leave_SimpleStatementSuite(
      self, original_node: cst.SimpleStatementSuite,
      updated_node: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
    return updated_node.with_changes(
        body=[new for old in updated_node.body for new in self._rewrite(old)])

  def _rewrite(self, statement: cst.BaseSmallStatement
               ) -> list[cst.BaseSmallStatement]:
    if isinstance(statement, cst.Import):
      return self._rewrite_import(statement)
    if isinstance(statement, cst.ImportFrom):
      return self._rewrite_import_from(statement)
    return [statement]

  def _rewrite_import(self, statement: cst.Import) -> list[cst.Import]:
    aliases, binds_jax = [], False
    for alias in statement.names:
      if dotted_name(alias.name) == LEGACY_MODULE:
        binds_jax |= alias.asname is None
        alias = alias.with_changes(name=cst.Name(NEW_MODULE))
      aliases.append(alias)
    rewritten = statement.with_changes(names=aliases)
    if binds_jax and self._add_jax_import:
      return [cst.Import(names=[cst.ImportAlias(cst.Name("jax"))]), rewritten]
    return [rewritten]

  def _rewrite_import_from(self, statement: cst.ImportFrom
                           ) -> list[cst.BaseSmallStatement]:
    module = None if statement.relative else dotted_name(statement.module)
    if module == LEGACY_MODULE:
      return [statement.with_changes(module=cst.Name(NEW_MODULE))]
    if module != "jax.experimental" or isinstance(statement.names,
                                                  cst.ImportStar):
      return [statement]
    ours = [alias for alias in statement.names
            if dotted_name(alias.name) == "host_callback"]
    rest = [alias for alias in statement.names
            if dotted_name(alias.name) != "host_callback"]
    if not ours:
      return [statement]
    new_import = _new_import(ours).with_changes(semicolon=statement.semicolon)
    if not rest:
      return [new_import]
    rest[-1] = rest[-1].with_changes(
        comma=_last_comma(rest[-1].comma, statement.names[-1].comma,
                          parenthesized=statement.lpar is not None))
    return [statement.with_changes(names=rest,
                                   semicolon=cst.MaybeSentinel.DEFAULT),
            new_import]


# --- Modules and Python files --------------------------------------------


def migrate_modules(codes: Sequence[str]) -> list[Migration]:
  """Migrates modules that share one namespace, in the order they run (one
  file, or the cells of a notebook); raises cst.ParserSyntaxError.

  Settings are not reported here (see `setting_reports`).
  """
  wrappers = [MetadataWrapper(cst.parse_module(code)) for code in codes]
  namespace = Namespace()
  analyzers = [Analyzer(namespace) for _ in wrappers]
  for wrapper, analyzer in zip(wrappers, analyzers):
    wrapper.visit(analyzer)
  add_jax_import = (namespace.plain_legacy_import
                    and not namespace.other_jax_import
                    and any(uses_name(wrapper, "jax") for wrapper in wrappers))
  rewriter = Rewriter(namespace.binds_host_callback, add_jax_import)
  return [Migration(wrapper.module.visit(rewriter).code,
                    sorted_reports([*analyzer.reports, *chain_reports(
                        analyzer, namespace.binds_host_callback)]))
          for wrapper, analyzer in zip(wrappers, analyzers)]


def sorted_reports(reports: Iterable[Report]) -> tuple[Report, ...]:
  return tuple(sorted(reports, key=lambda report: report.line))


def migrate_source(code: str) -> Migration:
  """Migrates the text of a Python file; raises cst.ParserSyntaxError."""
  [migration] = migrate_modules([code])
  return Migration(migration.code,
                   sorted_reports([*migration.reports, *setting_reports(code),
                                   *barrier_reports(code)]))
