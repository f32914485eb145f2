"""Run a compiled plan on Spark: build each operator's DataFrame once, then write sinks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from keyflow.api import nodes
from keyflow.errors import KeyflowError, PipelineError
from keyflow.plan.graph import JobGraph, Partitioner
from keyflow.runtime.errors import translate
from keyflow.runtime.exchange import null_key_condition, rebalance
from keyflow.runtime.operators import (
    NULL_KEY_MARKER,
    apply_keyed,
    apply_stateless,
    require_key_columns,
)
from keyflow.runtime.progress import progress_enabled, spark_progress
from keyflow.runtime.session import spark_session
from keyflow.state.durable import CheckpointedState

KEYED_KINDS = (nodes.AggregateNode.kind, nodes.ProcessNode.kind)

if TYPE_CHECKING:
    from keyflow.api.pipeline import Pipeline


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


def run_pipeline(pipeline: Pipeline, plan: JobGraph) -> RunResult:
    spark = pipeline_session(pipeline, plan)
    builder = FrameBuilder(spark, plan, pipeline.config["pipeline.null-keys"], pipeline.sinks)
    result = RunResult(plan)
    started = time.perf_counter()
    show = progress_enabled(pipeline.config["pipeline.progress"])
    try:
        for sink in pipeline.sinks:
            frame = builder.frame(sink)
            result.sinks.extend(builder.write_dead_letters(show))
            with spark_progress(spark, sink.name, show):
                clock = time.perf_counter()
                rows = builder.guarded(lambda frame=frame, sink=sink: sink.sink.write(frame), sink)
            result.sinks.append(SinkResult(sink.name, nodes.sink_target(sink.sink), rows, time.perf_counter() - clock))
    finally:
        builder.release()
    result.seconds = time.perf_counter() - started
    return result


def collect_node(pipeline: Pipeline, plan: JobGraph, node: nodes.Node) -> pa.Table:
    """Run the plan up to ``node`` and return its rows (for tests and notebooks)."""
    spark = pipeline_session(pipeline, plan)
    builder = FrameBuilder(spark, plan, pipeline.config["pipeline.null-keys"], [node])
    try:
        frame = builder.frame(node)
        builder.write_dead_letters(show=False)
        return builder.guarded(frame.toArrow, node)
    finally:
        builder.release()


class FrameBuilder:
    """Turns operators into DataFrames, each once; operators read by several are persisted."""

    def __init__(
        self,
        spark: SparkSession,
        plan: JobGraph,
        null_keys: str,
        roots: list[Any],
        sources: dict[int, DataFrame] | None = None,
        backends: dict[int, CheckpointedState] | None = None,
    ) -> None:
        """``sources`` replace reading a source (a streaming micro-batch); ``backends`` give
        keyed operators durable state (streaming); without them state lives for one run."""
        self.spark, self.plan, self.null_keys = spark, plan, null_keys
        self._sources, self._backends = sources or {}, backends or {}
        self._consumers = _consumer_counts(roots)
        self._frames: dict[int, DataFrame] = {}
        self._keyed: dict[int, tuple[nodes.KeyedNode, DataFrame]] = {}  # with its input, for null-key counts
        self._dead_letters: list[tuple[nodes.KeyedNode, DataFrame]] = []
        self._persisted: list[DataFrame] = []

    def frame(self, node: nodes.Node) -> DataFrame:
        if node.uid in self._frames:
            return self._frames[node.uid]
        operator = self.plan.operator(node.uid)
        if node.uid in self._sources:
            frame = self._sources[node.uid]
        elif isinstance(node, nodes.SourceNode):
            read = node.source.read
            frame = self.guarded(lambda: read(self.spark, operator.parallelism), node)
        else:
            upstream = self.frame(node.inputs[0])
            if operator.input_partitioner == Partitioner.REBALANCE.value:
                upstream = rebalance(upstream, operator.parallelism)
            if isinstance(node, nodes.KeyedNode):
                require_key_columns(node, upstream)
                self._keyed[node.uid] = (node, upstream)
                if node.on_null is not None:
                    self._dead_letters.append((node, upstream.filter(null_key_condition(node.keys))))
                    upstream = upstream.filter(~null_key_condition(node.keys))
                policy = "keep" if node.on_null is not None else self.null_keys
                frame = apply_keyed(node, upstream, self.plan, policy, self._backends.get(node.uid))
            elif isinstance(node, nodes.SinkNode):
                frame = upstream
            else:
                frame = apply_stateless(node, upstream)
        if self._consumers.get(node.uid, 0) > 1:
            frame = frame.persist()
            self._persisted.append(frame)
        self._frames[node.uid] = frame
        return frame

    def key_types(self, uid: int) -> dict[str, str]:
        """The Spark types of a built keyed operator's key columns."""
        node, upstream = self._keyed[uid]
        return {key: upstream.schema[key].dataType.simpleString() for key in node.keys}

    def take_dead_letters(self) -> list[tuple[nodes.KeyedNode, DataFrame]]:
        """Rows with null keys, per operator with a dead-letter sink, not yet written."""
        taken, self._dead_letters = self._dead_letters, []
        return taken

    def write_dead_letters(self, show: bool) -> list[SinkResult]:
        """Write rows with null keys to the dead-letter sinks of the operators built so far."""
        results = []
        for node, frame in self.take_dead_letters():
            label = f"dead letters of {node.name!r}"
            with spark_progress(self.spark, label, show):
                clock = time.perf_counter()
                rows = self.guarded(lambda frame=frame, node=node: node.on_null.write(frame), node)
            results.append(SinkResult(label, nodes.sink_target(node.on_null), rows, time.perf_counter() - clock))
        return results

    def guarded(self, action: Any, node: nodes.Node) -> Any:
        """Run a Spark action; turn its failure into one clear keyflow error."""
        try:
            return action()
        except KeyflowError:
            raise
        except Exception as error:
            raise self._explain(error, node) from None

    def _explain(self, error: Exception, node: nodes.Node) -> PipelineError:
        text = str(error)
        if NULL_KEY_MARKER in text:
            uid = int(text.split(NULL_KEY_MARKER, 1)[1].split()[0].strip("'\"."))
            return self._null_key_error(*self._keyed[uid])
        return translate(error, f"while running {node.name!r}")

    def _null_key_error(self, node: nodes.KeyedNode, upstream: DataFrame) -> PipelineError:
        count = upstream.filter(null_key_condition(node.keys)).count()
        total = upstream.count()
        return PipelineError(
            f"operator {node.name!r}: {count} of {total} rows have a null in key column(s) {list(node.keys)}; "
            "filter them out first, set pipeline.null-keys=drop, or keep them with "
            "key_by(..., on_null=parquet('out/dead_letters'))"
        )

    def release(self) -> None:
        for frame in self._persisted:
            frame.unpersist()


def _consumer_counts(roots: list[Any]) -> dict[int, int]:
    counts: dict[int, int] = {}
    seen: set[int] = set()
    pending = list(roots)
    while pending:
        node = pending.pop()
        if node.uid in seen:
            continue
        seen.add(node.uid)
        for upstream in node.inputs:
            counts[upstream.uid] = counts.get(upstream.uid, 0) + 1
            pending.append(upstream)
    return counts


def pipeline_session(pipeline: Pipeline, plan: JobGraph) -> SparkSession:
    """The session, with Spark's own shuffles (inside aggregations) as wide as the keyed
    operators, unless the pipeline sets ``spark.sql.shuffle.partitions`` itself."""
    keyed = [op.parallelism for vertex in plan.vertices for op in vertex.operators if op.kind in KEYED_KINDS]
    settings = {
        "spark.app.name": str(pipeline.config["pipeline.name"]),
        "spark.sql.shuffle.partitions": str(max(keyed, default=plan.default_parallelism)),
        **pipeline.config.spark,
    }
    return spark_session(settings, app_name=str(pipeline.config["pipeline.name"]))
