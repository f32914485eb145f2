"""Run a compiled plan as one batch job: build each operator's DataFrame, write every sink."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql import SparkSession

from keyflow.config import (
    AUTO_PARALLELISM,
    AUTO_PARALLELISM_BALANCE,
    AUTO_PARALLELISM_ENABLED,
    AUTO_PARALLELISM_MAX,
    AUTO_PARALLELISM_MIN,
    AVG_DATA_VOLUME_PER_TASK,
    DEFAULT_PARALLELISM,
    DEFAULT_SOURCE_PARALLELISM,
    MAX_BROADCAST_RATIO,
    PROGRESS,
)
from keyflow.errors import ConfigError, KeyflowError
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.graph import JobGraph
from keyflow.plan.nodes import sink_target
from keyflow.runtime.adaptive_exchange import StageReport
from keyflow.runtime.frames import FrameBuilder, session_for
from keyflow.runtime.metrics import rows_read_by_partition
from keyflow.runtime.progress import progress_enabled, spark_progress
from keyflow.scheduler.batch_parallelism import AutoParallelism


@dataclass(frozen=True)
class SinkResult:
    name: str
    target: str
    rows: int | None  # None where the sink cannot count (blackhole)
    seconds: float


@dataclass
class RunResult:
    """What a run wrote, sink by sink."""

    plan: JobGraph
    sinks: list[SinkResult] = field(default_factory=list)
    seconds: float = 0.0
    stages: list[StageReport] = field(default_factory=list)  # keyed stages sized by auto-parallelism
    parallelism: dict[int, int] = field(default_factory=dict)  # what each operator ran at, by id


def auto_parallelism(plan: CompiledPlan, task_slots: int) -> tuple[AutoParallelism | None, int | None]:
    """The auto-parallelism options of a batch run (None: off) and the sources' parallelism.

    The upper bound is ``…max-parallelism``, else ``parallelism.default`` if set (as Flink),
    else the task slots Spark has; never above the max parallelism K."""
    config = plan.config
    if not config.get(AUTO_PARALLELISM_ENABLED):
        return None, None
    upper, bound = config.get(AUTO_PARALLELISM_MAX), "set"
    if upper is None:
        configured = config.get(DEFAULT_PARALLELISM)
        upper, bound = (configured, "parallelism.default") if configured else (task_slots, "Spark's task slots")
    lower = config.get(AUTO_PARALLELISM_MIN)
    if bound != "set" and lower > upper and plan.auto_sized():
        raise ConfigError(
            f"{AUTO_PARALLELISM}min-parallelism={lower} is above the upper "
            f"bound {upper} ({bound}, as {AUTO_PARALLELISM}max-parallelism is not set); lower min-parallelism or set "
            "max-parallelism"
        )
    try:
        options = AutoParallelism(
            lower,
            min(upper, plan.max_parallelism),
            config.get(AVG_DATA_VOLUME_PER_TASK),
            config.get(MAX_BROADCAST_RATIO),
            config.get(AUTO_PARALLELISM_BALANCE) == "bytes",
        )
    except KeyflowError as error:
        raise ConfigError(f"{AUTO_PARALLELISM}{error}") from None
    return options, config.get(DEFAULT_SOURCE_PARALLELISM)


def run_batch(plan: CompiledPlan) -> RunResult:
    spark = session_for(plan)
    options, sources = auto_parallelism(plan, spark.sparkContext.defaultParallelism)
    builder = FrameBuilder(spark, plan, auto_parallelism=options, source_parallelism=sources)
    result = RunResult(plan.graph)
    started = time.perf_counter()
    show = progress_enabled(plan.config.get(PROGRESS))
    try:
        for sink in plan.sinks:
            frame = builder.frame(sink.id)
            result.sinks.extend(_write_dead_letters(builder, show))
            with spark_progress(spark, sink.name, show):
                clock = time.perf_counter()
                rows = builder.guarded(lambda frame=frame, sink=sink: sink.sink.write(frame), sink)
            result.sinks.append(SinkResult(sink.name, sink_target(sink.sink), rows, time.perf_counter() - clock))
    finally:
        builder.release()
    result.stages = [_with_rows(spark, stage) for stage in builder.stages]
    result.parallelism = dict(builder.parallelism)
    result.seconds = time.perf_counter() - started
    return result


def _with_rows(spark: SparkSession, stage: StageReport) -> StageReport:
    """The stage with the rows each subtask read, from Spark's task metrics (Spark's map
    statistics, which decided, count bytes only)."""
    if stage.rdd_id is None or spark.sparkContext.uiWebUrl is None:
        return stage
    rows = rows_read_by_partition(spark, stage.rdd_id)
    if rows is None or len(rows) != stage.decision.parallelism:
        return stage
    return replace(stage, subtask_rows=tuple(rows))


def collect(plan: CompiledPlan) -> pa.Table:
    """Run the plan up to its one root and return the root's rows (for tests and notebooks)."""
    (root,) = plan.roots
    spark = session_for(plan)
    options, sources = auto_parallelism(plan, spark.sparkContext.defaultParallelism)
    builder = FrameBuilder(spark, plan, auto_parallelism=options, source_parallelism=sources)
    try:
        frame = builder.frame(root)
        _write_dead_letters(builder, show=False)
        return builder.guarded(frame.toArrow, plan.nodes[root])
    finally:
        builder.release()


def _write_dead_letters(builder: FrameBuilder, show: bool) -> list[SinkResult]:
    """Write rows with null keys and late rows to their sinks, for the operators built so far."""
    results = []
    for letters in builder.take_dead_letters():
        label = f"{letters.kind.replace('-', ' ')} of {letters.node.name!r}"
        with spark_progress(builder.spark, label, show):
            clock = time.perf_counter()
            rows = builder.guarded(lambda letters=letters: letters.sink.write(letters.rows), letters.node)
        results.append(SinkResult(label, sink_target(letters.sink), rows, time.perf_counter() - clock))
    return results
