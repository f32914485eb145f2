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
from keyflow.sql.statements import DIALECT, interval_micros

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
    """``OVER w … WINDOW w AS (…)`` as if each OVER spelled the window out (Flink's WINDOW clause)."""
    named = {window.name.lower(): window for window in query.args.get("windows") or []}
    if not named:
        return
    for window in list(query.find_all(exp.Window)):
        alias = window.args.get("alias")
        if alias is None or window.args.get("partition_by") or window.args.get("order"):
            continue
        spec = named.get(alias.name.lower())
        if spec is None:
            raise SqlError(f"OVER {alias.name} at {position(window)} names no window of the WINDOW clause "
                           f"({', '.join(named)})")  # fmt: skip
        for arg in ("partition_by", "order", "spec"):
            if spec.args.get(arg) is not None:
                window.set(arg, spec.args[arg].copy() if not isinstance(spec.args[arg], list) else
                           [e.copy() for e in spec.args[arg]])  # fmt: skip
        window.set("alias", None)
    query.set("windows", None)


def over_aggregates(expressions: list[exp.Expr]) -> list[exp.Window]:
    """The OVER aggregates of a select list (not ROW_NUMBER, RANK, …)."""
    return [w for e in expressions for w in e.find_all(exp.Window) if isinstance(_call(w), AGGREGATES)]


def read_over(expressions: list[exp.Expr]) -> tuple[Over, list[exp.Expr]]:
    """The select list's OVER window and aggregates, and the list reading them as columns."""
    windows = over_aggregates(expressions)
    first = windows[0]
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
        if isinstance(call, exp.Filter) or (isinstance(call, exp.Count) and isinstance(call.this, exp.Distinct)):
            raise SqlError(f"{call.sql(dialect=DIALECT)} OVER at {position(node)}: DISTINCT and FILTER are not "
                           "supported in an OVER aggregation yet")  # fmt: skip
        text = spark_sql(call)
        name = next((n for n, t in calls.items() if t == text), f"{PREFIX}{len(calls)}")
        calls[name] = text
        return exp.column(name)

    rewritten = [e.copy().transform(replace) for e in expressions]
    return Over(partition, items[0].this, _frame(first), calls, first), rewritten


def _call(window: exp.Window) -> exp.Expr:
    call: exp.Expr = window.this
    return call.this if isinstance(call, exp.Filter) else call


def _spec(window: exp.Window) -> tuple[str, ...]:
    return tuple(str(window.args[arg].sql(dialect=DIALECT)) if not isinstance(window.args.get(arg), list) else
                 ",".join(e.sql(dialect=DIALECT) for e in window.args[arg])
                 for arg in ("partition_by", "order", "spec") if window.args.get(arg) is not None)  # fmt: skip


def _frame(window: exp.Window) -> OverFrame:
    """ROWS/RANGE BETWEEN … PRECEDING AND CURRENT ROW (none: RANGE UNBOUNDED PRECEDING, the
    SQL default with ORDER BY)."""
    spec = window.args.get("spec")
    if spec is None:
        return OverFrame()
    rows = str(spec.args.get("kind", "")).upper() == "ROWS"
    said = f"{spec.sql(dialect=DIALECT)} at {position(window)}"
    end = spec.args.get("end")
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
