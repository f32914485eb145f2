"""Rows to windows, as Spark SQL expressions, before the keyed exchange (stateless, vectorised).

Event time is read as microseconds (``unix_micros``). A row is late when every window it
belongs to is past the watermark it arrived under plus the allowed lateness (Flink's
``WindowOperator`` sends such a row to its late side output); a row with a null event time
has no window. Both become dead letters with the reason, or are dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from keyflow.plan.event_time import NO_WATERMARK, WindowAssigner, iso_micros
from keyflow.plan.nodes import WINDOW_END, WINDOW_START, Windowing

EVENT_MICROS = "__event_us"
REJECTED = "__rejected"
REASON = "reason"


@dataclass
class Assigned:
    """Rows with their window(s), and the rows that have none (late, or no event time) when asked for."""

    rows: DataFrame
    rejected: DataFrame | None


def event_micros(column: str) -> Column:
    """Event time in microseconds; null where the column is null or does not parse as a timestamp."""
    return F.expr(_micros_sql(_quoted(column)))


def field_micros(struct: str, field: str) -> Column:
    """:func:`event_micros` of a field of a struct column (a two-input operator's packed rows)."""
    return F.expr(_micros_sql(f"{_quoted(struct)}.{_quoted(field)}"))


def _micros_sql(reference: str) -> str:
    return f"unix_micros(try_cast({reference} AS TIMESTAMP))"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def split_late(
    windowing: Windowing, frame: DataFrame, watermark_before: int, count: Observation | None, rejected: bool
) -> Assigned:
    """Rows with an event time whose last window is still open (or within the lateness), and
    (with ``rejected``) the others with their reason; ``count`` observes how many were rejected.
    Expressions are SQL text: each Py4J call to build a column costs about a millisecond, and a
    micro-batch builds these anew (the watermark is in them)."""
    assigner, lateness = windowing.assigner, windowing.allowed_lateness
    # a row alone makes the session [ts, ts + gap)
    window_end = (
        f"{EVENT_MICROS} + {assigner.gap}" if assigner.merging else f"{_last_start(assigner)} + {assigner.size}"
    )
    # A session row is late only once merged with the key's open sessions: the worker decides.
    judged = watermark_before != NO_WATERMARK and not assigner.merging
    late = f" OR {window_end} - 1 + {lateness} <= {watermark_before}" if judged else ""
    flagged = frame.withColumn(EVENT_MICROS, event_micros(windowing.time_column)).withColumn(
        REJECTED, F.expr(f"{EVENT_MICROS} IS NULL{late}")
    )
    if count is not None:
        flagged = flagged.observe(count, F.expr(f"sum(CAST({REJECTED} AS BIGINT)) AS rows"))
    accepted = flagged.where(f"NOT {REJECTED}").drop(REJECTED)
    if not rejected:
        return Assigned(accepted, None)
    watermark = iso_micros(watermark_before)
    null = F.col(EVENT_MICROS).isNull()
    reason = F.when(null, F.lit(f"event time {windowing.time_column!r} is null or not a timestamp")).otherwise(
        F.format_string(
            f"late: its last window ends at %s; the watermark {watermark} had passed its last microsecond plus the "
            f"allowed lateness ({lateness} us)",
            F.expr(f"CAST(timestamp_micros({window_end}) AS STRING)"),
        )
    )
    late_rows = flagged.where(REJECTED).withColumn(REASON, reason).drop(EVENT_MICROS, REJECTED)
    return Assigned(accepted, late_rows)


def with_windows(windowing: Windowing, rows: DataFrame, watermark_before: int) -> DataFrame:
    """Tumbling, sliding or cumulating: one row per (row, window) with ``window_start``/``window_end``
    (microseconds in ``__start_us``); windows past the watermark and lateness are left out."""
    assigner = windowing.assigner
    if assigner.kind == "cumulate":
        return _cumulating(windowing, rows, watermark_before)
    count = -(-assigner.size // assigner.slide)  # Flink: from the last start back while start > ts - size
    if count == 1:
        windowed = rows.withColumn("__start_us", F.expr(_last_start(assigner)))
    else:
        windowed = rows.withColumn("__back", F.expr(f"explode(sequence(0, {count - 1}))"))
        windowed = windowed.withColumn("__start_us", F.expr(f"{_last_start(assigner)} - __back * {assigner.slide}"))
        conditions = [f"__start_us > {EVENT_MICROS} - {assigner.size}"] if assigner.size % assigner.slide else []
        if watermark_before != NO_WATERMARK:
            conditions.append(f"__start_us + {assigner.size - 1 + windowing.allowed_lateness} > {watermark_before}")
        if conditions:
            windowed = windowed.where(" AND ".join(conditions))
    return windowed.withColumns(
        {
            WINDOW_START: F.expr("timestamp_micros(__start_us)"),
            WINDOW_END: F.expr(f"timestamp_micros(__start_us + {assigner.size})"),
        }
    )


def _cumulating(windowing: Windowing, rows: DataFrame, watermark_before: int) -> DataFrame:
    """Each window of the row's period that ends after it: ends ``start + k·step`` for ``k``
    from the step holding the row to ``size / step`` (Flink's ``CumulativeWindowAssigner``)."""
    assigner = windowing.assigner
    steps = assigner.size // assigner.slide
    first = f"CAST(({EVENT_MICROS} - __start_us) DIV {assigner.slide} AS INT) + 1"
    windowed = rows.withColumn("__start_us", F.expr(_last_start(assigner)))
    windowed = windowed.withColumn("__step", F.expr(f"explode(sequence({first}, {steps}))"))
    windowed = windowed.withColumn("__end_us", F.expr(f"__start_us + __step * {assigner.slide}"))
    if watermark_before != NO_WATERMARK:
        windowed = windowed.where(f"__end_us - 1 + {windowing.allowed_lateness} > {watermark_before}")
    return windowed.withColumns(
        {WINDOW_START: F.expr("timestamp_micros(__start_us)"), WINDOW_END: F.expr("timestamp_micros(__end_us)")}
    ).drop("__step", "__end_us")


def _last_start(assigner: WindowAssigner) -> str:
    """The start of the latest window holding the row: Flink's ``TimeWindow.getWindowStartWithOffset``."""
    return f"({EVENT_MICROS} - pmod({EVENT_MICROS} - {assigner.offset}, {assigner.period}))"
