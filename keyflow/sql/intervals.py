"""Flink's interval join condition: the conjuncts of a join's condition that bound one table's
event time by the other's (``b.ts BETWEEN a.ts - INTERVAL '1' HOUR AND a.ts``), as bounds of
``right time - left time`` in microseconds. Follows Flink's ``IntervalJoinUtil``: a time
predicate is a comparison whose two sides each read one table's event-time column plus or
minus intervals; a join is an interval join with exactly two of them bounding the distance
from below and above, or one equality; a strict ``<``/``>`` moves its bound by one
microsecond (keyflow's time unit; Flink's is the millisecond). Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from keyflow.sql.errors import SqlError
from keyflow.sql.statements import interval_micros

LEFT, RIGHT = 0, 1
_COMPARISONS = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ)
_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ
}  # fmt: skip


@dataclass(frozen=True)
class Bound:
    """``right time - left time`` compared by ``kind`` (``GT``, ``GTE``, ``LT``, ``LTE``, ``EQ``) with ``value``."""

    kind: type[exp.Expr]
    value: int

    @property
    def lower(self) -> int | None:
        """The inclusive lower bound it sets, if any."""
        lowers: dict[type[exp.Expr], int] = {exp.GTE: self.value, exp.GT: self.value + 1, exp.EQ: self.value}
        return lowers.get(self.kind)

    @property
    def upper(self) -> int | None:
        """The inclusive upper bound it sets, if any."""
        uppers: dict[type[exp.Expr], int] = {exp.LTE: self.value, exp.LT: self.value - 1, exp.EQ: self.value}
        return uppers.get(self.kind)


def interval_bounds(
    conjuncts: list[exp.Expr], side_of: Callable[[exp.Column], int | None]
) -> tuple[tuple[int, int] | None, list[exp.Expr]]:
    """The bounds ``(lower, upper)`` of ``right time - left time`` the conjuncts set and the
    conjuncts left over; ``(None, conjuncts)`` where they do not make an interval join.
    ``side_of``: LEFT or RIGHT for a column that is that table's event-time column, else None."""
    bounds: list[Bound] = []
    rest: list[exp.Expr] = []
    for conjunct in conjuncts:
        parts = _comparisons(conjunct)
        found = [_bound(part, side_of) for part in parts]
        if parts and all(bound is not None for bound in found):
            bounds.extend(bound for bound in found if bound is not None)
        else:
            rest.append(conjunct)
    lowers = [b.lower for b in bounds if b.lower is not None]
    uppers = [b.upper for b in bounds if b.upper is not None]
    equality = len(bounds) == 1 and bounds[0].kind is exp.EQ
    ranges = len(bounds) == 2 and len(lowers) == 1 and len(uppers) == 1 and exp.EQ not in {b.kind for b in bounds}
    if not (equality or ranges):
        return None, conjuncts
    return (lowers[0], uppers[0]), rest


def _comparisons(conjunct: exp.Expr) -> list[exp.Expr]:
    """The comparisons a conjunct stands for (``x BETWEEN a AND b`` is ``x >= a`` and ``x <= b``)."""
    if isinstance(conjunct, exp.Between) and not conjunct.args.get("symmetric"):
        value, low, high = conjunct.this, conjunct.args["low"], conjunct.args["high"]
        return [exp.GTE(this=value.copy(), expression=low.copy()), exp.LTE(this=value.copy(), expression=high.copy())]
    return [conjunct] if isinstance(conjunct, _COMPARISONS) else []


def _bound(comparison: exp.Expr, side_of: Callable[[exp.Column], int | None]) -> Bound | None:
    """``comparison`` as a bound of ``right time - left time``, or None: not a time predicate."""
    first, second = _offset(comparison.this, side_of), _offset(comparison.expression, side_of)
    if first is None or second is None or first[0] == second[0]:
        return None
    kind = type(comparison)
    if first[0] == LEFT:  # left + a op right + b: right - left (op flipped) a - b
        return Bound(_FLIPPED[kind], first[1] - second[1])
    return Bound(kind, second[1] - first[1])  # right + a op left + b: right - left op b - a


def _offset(tree: exp.Expr, side_of: Callable[[exp.Column], int | None]) -> tuple[int, int] | None:
    """``tree`` as (side, microseconds): one table's event time plus or minus intervals; None otherwise."""
    if isinstance(tree, exp.Paren):
        return _offset(tree.this, side_of)
    if isinstance(tree, exp.Column):
        side = side_of(tree)
        return None if side is None else (side, 0)
    if isinstance(tree, (exp.Add, exp.Sub)):
        sign = 1 if isinstance(tree, exp.Add) else -1
        if _is_interval(tree.expression):
            time, interval = _offset(tree.this, side_of), _micros(tree.expression)
        elif _is_interval(tree.this) and sign == 1:
            time, interval = _offset(tree.expression, side_of), _micros(tree.this)
        else:
            return None
        return None if time is None or interval is None else (time[0], time[1] + sign * interval)
    return None


def _is_interval(tree: exp.Expr) -> bool:
    return isinstance(tree, exp.Interval) or (isinstance(tree, exp.Neg) and isinstance(tree.this, exp.Interval))


def _micros(interval: exp.Expression) -> int | None:
    try:
        return interval_micros(interval, "an interval join's bound", signed=True)
    except SqlError:
        return None  # an interval keyflow cannot measure (months): a plain condition of a regular join


def is_time_equality(conjunct: exp.Expr, side_of: Callable[[exp.Column], int | None]) -> bool:
    """Whether ``conjunct`` equates the two tables' event times (``a.ts = b.ts + INTERVAL …``):
    an interval join's bound, not a key (Flink reads the whole condition for its bounds)."""
    return isinstance(conjunct, exp.EQ) and _bound(conjunct, side_of) is not None
