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
    """Rows with their window(s), and the rows that have none (late, or no event time)."""

    rows: DataFrame
    rejected: DataFrame


def event_micros(column: str) -> Column:
    """Event time in microseconds; null where the column is null or does not parse as a timestamp."""
    return F.unix_micros(F.col(column).try_cast("timestamp"))


def split_late(windowing: Windowing, frame: DataFrame, watermark_before: int, count: Observation | None) -> Assigned:
    """Rows with an event time whose last window is still open (or within the lateness), and
    the others with their reason; ``count`` observes how many were rejected."""
    rows = frame.withColumn(EVENT_MICROS, event_micros(windowing.time_column))
    assigner, lateness = windowing.assigner, windowing.allowed_lateness
    if assigner.merging:  # a row alone makes the session [ts, ts + gap)
        last_end = F.col(EVENT_MICROS) + F.lit(assigner.gap)
    else:
        last_end = _last_start(assigner) + F.lit(assigner.size)
    null = F.col(EVENT_MICROS).isNull()
    # A session row is late only once merged with the key's open sessions: the worker decides.
    judged = watermark_before != NO_WATERMARK and not assigner.merging
    late = last_end - 1 + lateness <= F.lit(watermark_before) if judged else F.lit(False)
    flagged = rows.withColumn(REJECTED, null | late)
    if count is not None:
        flagged = flagged.observe(count, F.sum(F.col(REJECTED).cast("long")).alias("rows"))
    watermark = iso_micros(watermark_before)
    reason = F.when(null, F.lit(f"event time {windowing.time_column!r} is null or not a timestamp")).otherwise(
        F.format_string(
            f"late: its last window ends at %s; the watermark {watermark} had passed its last microsecond plus the "
            f"allowed lateness ({lateness} us)",
            F.timestamp_micros(last_end).cast("string"),
        )
    )
    rejected = flagged.filter(F.col(REJECTED)).withColumn(REASON, reason).drop(EVENT_MICROS, REJECTED)
    return Assigned(flagged.filter(~F.col(REJECTED)).drop(REJECTED), rejected)


def with_windows(windowing: Windowing, rows: DataFrame, watermark_before: int) -> DataFrame:
    """Tumbling or sliding: one row per (row, window) with ``window_start``/``window_end``
    (microseconds in ``__start_us``); windows past the watermark and lateness are left out."""
    assigner = windowing.assigner
    last_start = _last_start(assigner)
    count = -(-assigner.size // assigner.slide)  # Flink: from the last start back while start > ts - size
    if count == 1:
        windowed = rows.withColumn("__start_us", last_start)
    else:
        windowed = rows.withColumn("__back", F.explode(F.sequence(F.lit(0), F.lit(count - 1))))
        windowed = windowed.withColumn("__start_us", last_start - F.col("__back") * F.lit(assigner.slide))
        if assigner.size % assigner.slide:
            windowed = windowed.filter(F.col("__start_us") > F.col(EVENT_MICROS) - F.lit(assigner.size))
    if watermark_before != NO_WATERMARK and count > 1:
        open_ = F.col("__start_us") + F.lit(assigner.size - 1 + windowing.allowed_lateness) > F.lit(watermark_before)
        windowed = windowed.filter(open_)
    return windowed.withColumn(WINDOW_START, F.timestamp_micros(F.col("__start_us"))).withColumn(
        WINDOW_END, F.timestamp_micros(F.col("__start_us") + F.lit(assigner.size))
    )


def _last_start(assigner: WindowAssigner) -> Column:
    """The start of the latest window holding the row: Flink's ``TimeWindow.getWindowStartWithOffset``."""
    micros = F.col(EVENT_MICROS)
    return micros - F.pmod(micros - F.lit(assigner.offset), F.lit(assigner.slide))
