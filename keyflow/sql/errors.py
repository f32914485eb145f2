"""The SQL layer's error, and where in the script a construct stands. Pure."""

from __future__ import annotations

from sqlglot import exp

from keyflow.errors import PlanError

__all__ = ["SqlError", "position"]


class SqlError(PlanError):
    """A statement keyflow cannot run: names the construct, where it is and what to do."""


def position(node: exp.Expr | list[exp.Expr] | None) -> str:
    """``line L, column C`` of the first token of ``node`` that the parser located."""
    if isinstance(node, list):
        node = node[0] if node else None
    if node is None:
        return "position unknown"
    for child in node.walk():
        meta = child.meta if isinstance(child, exp.Expr) else {}
        if "line" in meta:
            return f"line {meta['line']}, column {meta['col']}"
    return "position unknown"
