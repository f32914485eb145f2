"""Spark SQL trees built from short templates, for the rewrites that give Flink's meanings.

A rewrite reads best as the Spark SQL it produces; :func:`spark` parses such a template and
puts the call's argument trees where it names ``_argument``. Pure: sqlglot trees in and out.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp


def spark(template: str, **arguments: exp.Expr) -> exp.Expr:
    """``template`` (Spark SQL) with each column ``_name`` replaced by ``arguments[name]``."""

    def put(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table and node.name.startswith("_"):
            argument = arguments.get(node.name[1:])
            if argument is not None:
                return argument.copy()
        return node

    return _parsed(template).copy().transform(put)


def null_if_any_null(tree: exp.Expr, *arguments: exp.Expr) -> exp.Expr:
    """``tree``, or NULL where an argument is NULL: Flink's rule for its string functions
    (``generateCallIfArgsNotNull``), which a rewrite's CASE branches would otherwise break."""
    nulls = [exp.Is(this=argument.copy(), expression=exp.Null()) for argument in arguments]
    return exp.Case(ifs=[exp.If(this=exp.or_(*nulls), true=exp.Null())], default=tree)


def call(name: str, *arguments: exp.Expr) -> exp.Expr:
    """A Spark function call as written (sqlglot's own function nodes may reorder arguments)."""
    return exp.Anonymous(this=name, expressions=list(arguments))


@functools.lru_cache(maxsize=64)
def _parsed(template: str) -> exp.Expr:
    return sqlglot.parse_one(template, read="spark")
