"""Spark SQL trees built from short templates, for the rewrites that give Flink's meanings.

A rewrite reads best as the Spark SQL it produces; :func:`spark` parses such a template and
puts the call's argument trees where it names ``_argument``. A template may name an argument
several times: a column or literal is repeated as is, anything else is computed once and
bound to a lambda variable, so that nesting does not multiply the expression and a
non-deterministic argument is one value. Pure: sqlglot trees in and out.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

BOUND = "__kf_arguments"  # the lambda variable holding a template's computed arguments


def spark(template: str, strict: bool = False, **arguments: exp.Expr) -> exp.Expr:
    """``template`` (Spark SQL) with each column ``_name`` replaced by ``arguments[name]``;
    ``strict``: NULL where any argument is NULL (Flink's rule for its string functions,
    ``generateCallIfArgsNotNull``, which a template's CASE branches would otherwise break)."""
    tree = _parsed(template).copy()
    if strict:
        nullable = [name for name, argument in arguments.items() if not isinstance(argument, exp.Literal)]
        nulls = [exp.Is(this=exp.column(f"_{name}"), expression=exp.Null()) for name in nullable]
        tree = exp.Case(ifs=[exp.If(this=exp.or_(*nulls), true=exp.Null())], default=tree) if nulls else tree
    computed = {name: argument for name, argument in arguments.items() if not _plain(argument)}
    placed = {
        name: exp.column(name, table=BOUND) if name in computed else argument for name, argument in arguments.items()
    }

    def put(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and not node.table and node.name.startswith("_"):
            argument = placed.get(node.name[1:])
            if argument is not None:
                return argument.copy()
        return node

    tree = tree.transform(put)
    if not computed:
        return tree
    fields = [part for name, argument in computed.items() for part in (exp.Literal.string(name), argument.copy())]
    bound = call("array", call("named_struct", *fields))
    lambda_ = exp.Lambda(this=tree, expressions=[exp.to_identifier(BOUND)])
    return call("element_at", call("transform", bound, lambda_), exp.Literal.number(1))


def call(name: str, *arguments: exp.Expr) -> exp.Expr:
    """A Spark function call as written (sqlglot's own function nodes may reorder arguments)."""
    return exp.Anonymous(this=name, expressions=list(arguments))


def _plain(argument: exp.Expr) -> bool:
    """Whether ``argument`` may be repeated: a column or a literal (also a negative number)."""
    inner = argument.this if isinstance(argument, exp.Neg) else argument
    return isinstance(inner, (exp.Column, exp.Literal, exp.Null, exp.Boolean))


@functools.lru_cache(maxsize=64)
def _parsed(template: str) -> exp.Expr:
    return sqlglot.parse_one(template, read="spark")
