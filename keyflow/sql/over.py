"""OVER aggregations in a select list (``SUM(x) OVER (PARTITION BY k ORDER BY ts ROWS
BETWEEN 10 PRECEDING AND CURRENT ROW)``), read as Flink's planner reads them: one window for
all of a query's OVER aggregates, ordered by the event time ascending, a frame that ends at
the current row. Pure: the plan node is made by ``keyflow.sql.queries``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from keyflow.plan.nodes import OverFrame
from keyflow.sql.errors import SqlError, position
from keyflow.sql.functions import spark_sql
from keyflow.sql.scope import own_nodes
from keyflow.sql.statements import DIALECT, interval_micros
from keyflow.sql.types import Types, integer_type

AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
PREFIX = "__over"


@dataclass(frozen=True)
class Over:
    """A query's OVER aggregates: the window's ``partition`` and ``order`` (a column) and
    ``frame``; ``calls``: output column -> the aggregate (Spark SQL); ``window``: the first
    OVER, where errors point."""

    partition: tuple[exp.Expr, ...]
    order: exp.Column
    frame: OverFrame
    calls: dict[str, str]
    window: exp.Window


def inline_named_windows(query: exp.Select) -> None:
    """``OVER w`` and ``OVER (w ORDER BY …)`` of this query (not its subqueries), with ``WINDOW
    w AS (…)``, as if each OVER spelled its window out: Flink's WINDOW clause, where an OVER may
    add what the named window lacks but not replace it."""
    named = {window.name.lower(): window for window in query.args.get("windows") or []}
    for window in [w for tree in own_nodes(query) for w in tree.find_all(exp.Window)]:
        alias = window.args.get("alias")
        if alias is None:
            continue
        base = named.get(alias.name.lower())
        if base is None:
            known = f"({', '.join(named)})" if named else "(the query has none)"
            raise SqlError(f"OVER {alias.name} at {position(window)} names no window of the WINDOW clause {known}")
        for arg, said in (("partition_by", "PARTITION BY"), ("order", "ORDER BY"), ("spec", "a frame")):
            if base.args.get(arg) is None or base.args.get(arg) == []:
                continue
            if window.args.get(arg):
                raise SqlError(f"OVER ({alias.name} …) at {position(window)} gives {said}, which window "
                               f"{alias.name} has already; a window may only add what it lacks")  # fmt: skip
            value = base.args[arg]
            window.set(arg, [e.copy() for e in value] if isinstance(value, list) else value.copy())
        window.set("alias", None)
    query.set("windows", None)


def over_aggregates(expressions: list[exp.Expr]) -> list[exp.Window]:
    """The OVER aggregates of a select list (not ROW_NUMBER, RANK, …)."""
    return [w for e in expressions for w in e.find_all(exp.Window) if isinstance(_call(w), AGGREGATES)]


def read_over(expressions: list[exp.Expr], types: Types) -> tuple[Over, list[exp.Expr]]:
    """The select list's OVER window and aggregates, and the list reading them as columns (an
    AVG of a known integer type read back as that type, as Flink's; ``types``: the input's)."""
    windows = over_aggregates(expressions)
    first = windows[0]
    for window in windows:
        nested = list(window.this.find_all(exp.Window))
        if nested:
            raise SqlError(f"OVER at {position(nested[0])} inside the argument of the OVER aggregate at "
                           f"{position(window)}; compute it in a derived table first")  # fmt: skip
    for window in windows[1:]:
        if _spec(window) != _spec(first):
            raise SqlError(f"OVER at {position(window)} differs from the OVER at {position(first)}; as in Flink, "
                           "all OVER aggregates of a query use one window (compute others in another query and "
                           "join)")  # fmt: skip
    partition = tuple(first.args.get("partition_by") or ())
    if not partition:
        raise SqlError(f"OVER at {position(first)} needs PARTITION BY: keyflow keys the aggregation by the partition "
                       "(Flink runs an unpartitioned OVER on one task)")  # fmt: skip
    ordered = first.args.get("order")
    items = ordered.expressions if ordered is not None else []
    if len(items) != 1 or not isinstance(items[0].this, exp.Column) or items[0].args.get("desc"):
        raise SqlError(f"OVER at {position(first)} must be ORDER BY the event-time column (the WATERMARK column), "
                       "ascending, alone, as Flink's OVER aggregations in streaming are")  # fmt: skip
    calls: dict[str, str] = {}

    def replace(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Window) and isinstance(_call(node), AGGREGATES)):
            return node
        call = node.this
        if isinstance(call, exp.Filter) or isinstance(call.this, exp.Distinct):
            raise SqlError(f"{call.sql(dialect=DIALECT)} OVER at {position(node)}: DISTINCT and FILTER are not "
                           "supported in an OVER aggregation yet")  # fmt: skip
        text = spark_sql(call)
        name = next((n for n, t in calls.items() if t == text), f"{PREFIX}{len(calls)}")
        calls[name] = text
        integer = integer_type(call.this, types) if isinstance(call, exp.Avg) else None
        return exp.column(name) if integer is None else exp.Cast(this=exp.column(name), to=integer)

    rewritten = [e.copy().transform(replace) for e in expressions]
    return Over(partition, items[0].this, _frame(first), calls, first), rewritten


def _call(window: exp.Window) -> exp.Expr:
    call: exp.Expr = window.this
    return call.this if isinstance(call, exp.Filter) else call


def _spec(window: exp.Window) -> tuple[object, ...]:
    """The window as Calcite groups OVER aggregates: names in any case, ASC as no direction,
    the frame as read (an omitted one is the default RANGE UNBOUNDED PRECEDING)."""
    partition = tuple(_named(e) for e in window.args.get("partition_by") or [])
    ordered = window.args.get("order")
    order = tuple((_named(e.this), bool(e.args.get("desc"))) for e in (ordered.expressions if ordered else []))
    return partition, order, _frame(window)


def _named(tree: exp.Expr) -> str:
    """A column by its name in any case (quoted or not); another expression as written."""
    return tree.name.lower() if isinstance(tree, exp.Column) else str(tree.sql(dialect=DIALECT)).lower()


def _frame(window: exp.Window) -> OverFrame:
    """ROWS/RANGE BETWEEN … PRECEDING AND CURRENT ROW (none: RANGE UNBOUNDED PRECEDING, the
    SQL default with ORDER BY)."""
    spec = window.args.get("spec")
    if spec is None:
        return OverFrame()
    rows = str(spec.args.get("kind", "")).upper() == "ROWS"
    said = f"{spec.sql(dialect=DIALECT)} at {position(window)}"
    end = spec.args.get("end") or "CURRENT ROW"  # ROWS 2 PRECEDING: Calcite's short form
    if str(end).upper() != "CURRENT ROW" or spec.args.get("end_side"):
        raise SqlError(f"the frame {said} must end at CURRENT ROW, as Flink's OVER aggregations do")
    start, side = spec.args.get("start"), str(spec.args.get("start_side") or "").upper()
    if str(start).upper() == "CURRENT ROW":
        return OverFrame(rows, 0)
    if side != "PRECEDING":
        raise SqlError(f"the frame {said} must start at UNBOUNDED PRECEDING, n PRECEDING or CURRENT ROW")
    if str(start).upper() == "UNBOUNDED":
        return OverFrame(rows)
    if rows:
        if not (isinstance(start, exp.Literal) and not start.is_string and str(start.this).isdigit()):
            raise SqlError(f"the frame {said}: ROWS counts rows: give a whole number of rows PRECEDING")
        return OverFrame(True, int(start.this))
    if not isinstance(start, exp.Interval):
        raise SqlError(f"the frame {said}: RANGE reaches back in event time: give INTERVAL '…' unit PRECEDING")
    return OverFrame(False, interval_micros(start, f"the frame {said}"))
