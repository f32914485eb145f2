"""A micro-batch's watermark, computed from its own rows before its keyed operators run.

One small Spark job per micro-batch (only for a source with a watermark strategy) takes the
largest event time of each split; the source's watermark then advances as
:class:`keyflow.state.watermarks.SourceWatermark` says. The keyed operators receive both
watermarks: the one the rows arrived under (what is late) and the one reached after them
(what fires), so a window closes in the micro-batch whose rows pass its end, as Flink's
watermark follows its records; Spark's own watermark only applies from the next micro-batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructType, TimestampNTZType, TimestampType

from keyflow.connectors.base import SPLIT_COLUMN, SplitSource
from keyflow.errors import PlanError
from keyflow.plan.builder import ntz_message
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.event_time import NO_WATERMARK
from keyflow.plan.nodes import Node, SourceNode
from keyflow.runtime.window_assign import event_micros
from keyflow.state.manifests import Manifest
from keyflow.state.timers import TaskTime
from keyflow.state.watermarks import SourceWatermark


def check_event_time_column(source: Node, schema: StructType) -> None:
    """At start (for sources that tell their columns only then): the watermark's column is there
    and holds instants (a timestamp, or a string or date Spark parses)."""
    if not isinstance(source, SourceNode) or source.watermark is None:
        return
    column, columns = source.watermark.column, [f.name for f in schema.fields if f.name != SPLIT_COLUMN]
    if column not in columns:
        raise PlanError(
            f"source {source.name!r}: the watermark's event-time column {column!r} is not among its columns "
            f"{columns}; name a timestamp column of the source"
        )
    kind = schema[column].dataType
    if isinstance(kind, TimestampNTZType):
        raise PlanError(ntz_message(source.name, column))
    if not isinstance(kind, (TimestampType, StringType, DateType)):
        raise PlanError(
            f"source {source.name!r}: the watermark's event-time column {column!r} is {kind.simpleString()}, not a "
            "timestamp; convert it first (numbers: timestamp_millis(...) or timestamp_seconds(...))"
        )


def batch_time(
    plan: CompiledPlan,
    source: SourceNode,
    frame: DataFrame,
    manifest: Manifest | None,
    restarted: bool,
    clock: Callable[[], float] = time.time,
) -> tuple[TaskTime, dict[str, Any], DataFrame]:
    """The times this micro-batch runs at, the watermarks to commit with it (by source uid),
    and the batch's rows without the split column; ``restarted``: the run's first micro-batch."""
    now = clock()
    processing = int(now * 1_000_000)
    strategy = source.watermark
    if strategy is None:
        return TaskTime(NO_WATERMARK, NO_WATERMARK, processing), {}, frame
    uid = plan.uid(source.id)
    before = SourceWatermark.from_dict(manifest.watermarks.get(uid) if manifest else None)
    event_time = event_micros(strategy.column)
    if SPLIT_COLUMN in frame.columns:
        rows = frame.groupBy(SPLIT_COLUMN).agg(F.max(event_time).alias("latest")).collect()
        observed = {int(row[0]): int(row[1]) for row in rows if row[1] is not None}
        split_count = source.source.current_splits() if isinstance(source.source, SplitSource) else 1
        frame = frame.drop(SPLIT_COLUMN)
    else:  # a source without splits: one watermark for all its rows
        latest = frame.agg(F.max(event_time)).collect()[0][0]
        observed, split_count = ({} if latest is None else {0: int(latest)}), 1
    after = before.advance(strategy, split_count, observed, now, restarted)
    idle = len(after.idle_splits(strategy, now)) == len(after.splits) > 0
    return TaskTime(before.watermark, after.watermark, processing, idle=idle), {uid: after.to_dict()}, frame
