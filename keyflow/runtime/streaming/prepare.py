"""Before the first micro-batch: the plan built once over an empty batch and checked.

Spark analyses a DataFrame when it is built, without running it. Building every operator
over an empty batch of the source's schema at start finds what only Spark can check (an
expression's columns and types, a sink's primary key) and the key columns' types, which
must match the checkpoint's, before any micro-batch runs or commits anything, so a failed
check never leaves a half-run batch behind and the per-batch path checks nothing again.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from keyflow.connectors.base import SPLIT_COLUMN
from keyflow.runtime.errors import guarded
from keyflow.runtime.frames import FrameBuilder
from keyflow.runtime.streaming import restore
from keyflow.runtime.streaming.commit import StreamState, keyed_state
from keyflow.runtime.streaming.watermarks import check_event_time_column
from keyflow.state.plan_file import PlanFile


def prepare(stream: StreamState, plan_file: PlanFile, spark: SparkSession, schemas: dict[int, StructType]) -> PlanFile:
    """Build and analyse the plan over no rows (``schemas``: each source's, by node id);
    ``plan_file`` with the key types recorded (a first run) or checked against the
    checkpoint's (a restore)."""
    plan = stream.plan
    empty = {source_id: spark.createDataFrame([], schema).drop(SPLIT_COLUMN) for source_id, schema in schemas.items()}
    for source_id, frame in empty.items():
        check_event_time_column(plan.nodes[source_id], frame.schema)
    builder = FrameBuilder(spark, plan, empty, keyed_state(stream, stream.committed + 1))
    try:
        for sink in plan.sinks:
            guarded(lambda sink=sink: builder.frame(sink.id), f"while preparing {sink.name!r}")
        builder.take_dead_letters()
        current = {uid: builder.key_types(node.id) for uid, node in plan.keyed_nodes().items()}
    finally:
        builder.release()
    return restore.check_key_types(stream.checkpoint, plan_file, plan, current)
