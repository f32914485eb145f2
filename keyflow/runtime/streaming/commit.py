"""One micro-batch, committed exactly once. Each micro-batch is one checkpoint version::

    keyed operators run (each subtask writes its state file for the version)
    sinks write the batch under a staging directory
    the manifest of the version is written (atomically): the commit point
    staged sink files are moved into place; old versions are deleted

A crash before the commit leaves the previous version intact: Spark replays the batch
(same offsets), which rewrites the same files. A crash after it is finished on restart
(the moves are repeated) and the replayed batch is skipped. So state and file sinks are
exactly-once. A rescale only changes which key-group ranges the next batch's subtasks
restore; no state file is rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.accumulators import Accumulator, AccumulatorParam, _accumulatorRegistry
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from keyflow.config import CHECKPOINTS_NUM_RETAINED, COMPACTION_MAX_DELTAS, PRE_KEYED_VERIFY
from keyflow.connectors.base import CommitsPartitions, Moves, StreamingSink
from keyflow.errors import RestoreError
from keyflow.paths import exists, filesystem
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.event_time import NO_WATERMARK
from keyflow.plan.nodes import Node
from keyflow.runtime.frames import FrameBuilder
from keyflow.runtime.streaming.faults import fault
from keyflow.runtime.streaming.inputs import split_sources
from keyflow.runtime.streaming.prekeyed import PreKeyedSource
from keyflow.runtime.streaming.results import BatchMetrics
from keyflow.runtime.streaming.watermarks import batch_time
from keyflow.state.assignment import StateFile, compacting_subtasks, needed_files
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.durable import CheckpointedState
from keyflow.state.integrity import retain_known
from keyflow.state.manifests import Manifest
from keyflow.state.plan_file import PlanFile
from keyflow.state.source_log import SourceLog
from keyflow.state.timers import TaskTime


@dataclass(frozen=True)
class StreamState:
    """What a micro-batch builds on: the plan it runs at, the checkpoint and its newest commit."""

    plan: CompiledPlan
    checkpoint: Checkpoint
    plan_file: PlanFile  # a copy goes into each manifest
    run_id: str
    source_ids: tuple[int, ...]
    manifest: Manifest | None
    source_log: SourceLog
    pre_keyed: PreKeyedSource | None = None
    retained: tuple[Manifest, ...] = ()  # the committed versions kept, oldest first (the newest is manifest)

    @property
    def committed(self) -> int:
        return self.manifest.version if self.manifest else -1

    @property
    def checkpoint_id(self) -> str:
        return self.plan_file.checkpoint_id


def commit_micro_batch(
    stream: StreamState,
    frame: DataFrame,
    batch: int,
    event: dict[str, Any] | None = None,
    first_of_run: bool = False,
) -> tuple[StreamState, BatchMetrics]:
    """Run micro-batch ``batch`` of the source rows ``frame`` and commit it as version
    ``batch``; ``event`` (a rescale) is logged with the batch once it is committed. Returns
    the stream at the new version."""
    started = time.perf_counter()
    plan, checkpoint = stream.plan, stream.checkpoint
    frame.sparkSession.conf.set("spark.sql.shuffle.partitions", str(plan.parallelism))
    # One Spark job per micro-batch: adaptive execution would run each shuffle stage as a job of
    # its own (~0.1 s apart) and coalesce the aggregation's partitions keyflow sized already.
    frame.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
    context = frame.sparkSession.sparkContext
    reports = {uid: context.accumulator([], _Appended()) for uid in plan.graph.keyed_operators()}
    key_reports = {uid: context.accumulator([], _Appended()) for uid in reports} if stream.pre_keyed else {}
    state = keyed_state(stream, batch, reports, key_reports)
    # Spark hands foreachBatch a micro-batch as computed rows (no column pruning reaches the
    # source), so every job over it computes the whole source again: a source read twice (its
    # watermark's job, then the batch) is persisted once, which halves a generated source's cost.
    times, watermarks, sources, observations, read_twice = {}, {}, {}, [], []
    for source_id, rows in split_sources(frame, stream.source_ids).items():
        if plan.nodes[source_id].watermark is not None:
            rows = rows.persist()
            read_twice.append(rows)
        times[source_id], marks, rows = batch_time(plan, plan.nodes[source_id], rows, stream.manifest, first_of_run)
        watermarks.update(marks)
        observations.append(Observation())
        sources[source_id] = rows.observe(observations[-1], F.count(F.lit(1)).alias("rows"))
    builder = FrameBuilder(frame.sparkSession, plan, sources, state, time=times)
    timed = [time for source_id, time in times.items() if plan.nodes[source_id].watermark is not None]
    time_now = TaskTime.earliest(timed or times.values())  # the watermark the batch reports
    try:
        # Every sink consumes its input in full, so each keyed subtask runs to its end and
        # writes its state file once (operators read by several sinks are persisted).
        outputs, staged = _stage_outputs(builder, batch, stream.manifest, time_now)
        fault("after-sink-write", batch)
        written: list[StateFile] = []
        operators = {}
        for uid in state:
            # A subtask without input rows wrote no file (unless a compaction was due):
            # its state did not change.
            with checkpoint.storage(f"committing micro-batch {batch}"):
                new = checkpoint.state_files.newest(_taken(reports[uid]))
            written += new
            previous = stream.manifest.operators.get(uid, []) if stream.manifest else []
            operators[uid] = needed_files([*previous, *new], plan.max_parallelism)
        with checkpoint.storage(f"committing micro-batch {batch}"):
            checkpoint.manifests.check_uncommitted(batch)  # before the driver writes anything of this version
        pre_keyed, conflicts, reported = {}, 0, dict[str, list[str]]()
        if stream.pre_keyed is not None:  # before the commit: a key in two splits commits nothing
            reported = {uid: _taken(accumulator) for uid, accumulator in key_reports.items()}
            pre_keyed, conflicts = stream.pre_keyed.verify(batch, plan.config.get(PRE_KEYED_VERIFY), reported)
        manifest = Manifest(
            batch, plan.parallelism, plan.max_parallelism, operators, staged, pre_keyed=pre_keyed,
            checkpoint_id=stream.checkpoint_id, plan=stream.plan_file.to_dict(), watermarks=watermarks,
        )  # fmt: skip
        with checkpoint.storage(f"committing micro-batch {batch}"):
            stream.source_log.push()  # the offsets of this batch are in the checkpoint before its commit
            checkpoint.manifests.commit(manifest)
        if event is not None:
            checkpoint.append_event({**event, "batch": batch})
        fault("after-commit", batch)
        publish(plan, manifest)
        fault("after-publish", batch)
        with checkpoint.storage(f"deleting versions older than micro-batch {batch}"):
            retained = retain_known(checkpoint, (*stream.retained, manifest), plan.config.get(CHECKPOINTS_NUM_RETAINED))
            for path in {path for paths in reported.values() for path in paths}:  # checked: no longer needed
                with contextlib.suppress(FileNotFoundError):
                    checkpoint.fs.delete_file(checkpoint.path(path))
    finally:
        builder.release()
        for rows in read_twice:
            rows.unpersist()
    metrics = BatchMetrics(
        batch, plan.parallelism, _observed_rows(observations), outputs, len(written),
        sum(f.bytes for f in written), time.perf_counter() - started, conflicts,
        None if time_now.watermark == NO_WATERMARK else time_now.watermark, _late_counts(builder),
    )  # fmt: skip
    return dataclasses.replace(stream, manifest=manifest, retained=retained), metrics


class _Appended(AccumulatorParam[list[Any]]):
    """An accumulator of lists: what the subtasks of successful tasks appended."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, value1: list[Any], value2: list[Any]) -> list[Any]:  # noqa: N802 - Spark's name
        value1.extend(value2)
        return value1


def _taken(accumulator: Accumulator[list[Any]]) -> list[Any]:
    """What the tasks reported; the accumulator is dropped (the driver would keep one per batch)."""
    _accumulatorRegistry.pop(accumulator.aid, None)
    return accumulator.value


def keyed_state(
    stream: StreamState,
    batch: int,
    reports: Mapping[str, Accumulator[list[Any]]] | None = None,
    key_reports: Mapping[str, Accumulator[list[Any]]] | None = None,
) -> dict[str, CheckpointedState]:
    """Per keyed operator (by uid): restore from the newest commit, write version ``batch``
    and report the files written to ``reports``, a pre-keyed operator's key reports to
    ``key_reports`` (accumulators: the driver lists nothing)."""
    plan = stream.plan
    state = {}
    for uid, operator in plan.graph.keyed_operators().items():
        files = tuple(stream.manifest.operators.get(uid, [])) if stream.manifest else ()
        compact = compacting_subtasks(
            files, plan.max_parallelism, operator.parallelism, plan.config.get(COMPACTION_MAX_DELTAS)
        )
        state[uid] = CheckpointedState(
            stream.checkpoint.uri, stream.checkpoint_id, stream.run_id, uid, stream.committed, batch, files,
            compact, plan.max_parallelism, (reports or {}).get(uid), (key_reports or {}).get(uid),
        )  # fmt: skip
    return state


def _stage_outputs(
    builder: FrameBuilder, batch: int, previous: Manifest | None, time_now: TaskTime
) -> tuple[dict[str, int], list[dict[str, object]]]:
    """Every sink, dead-letter sinks included, writes the batch where readers do not see it yet
    (with the partitions it will commit once the batch commits)."""
    outputs: dict[str, int] = {}
    staged: list[dict[str, object]] = []
    plan = builder.plan
    before = {entry["uid"]: entry for entry in previous.sinks} if previous else {}

    def stage(uid: str, label: str, sink: StreamingSink, frame: DataFrame, node: Node) -> None:
        rows, moves = builder.guarded(lambda: sink.stage(frame, batch), node)
        outputs[label] = rows
        staged.append({"uid": uid, "moves": moves, **_partition_commits(sink, moves, before.get(uid), time_now,
                                                                       builder.spark)})  # fmt: skip

    for sink in plan.sinks:
        stage(plan.uid(sink.id), sink.name, sink.sink, builder.frame(sink.id), sink)
    by_uid = plan.outputs()
    for letters in builder.take_dead_letters():
        uid = f"{plan.uid(letters.node.id)}/{letters.kind}"
        label, sink = by_uid[uid]
        stage(uid, label, sink, letters.rows, letters.node)
    return outputs, staged


def _partition_commits(
    sink: StreamingSink, moves: Moves, previous: dict[str, Any] | None, time_now: TaskTime, spark: SparkSession
) -> dict[str, Any]:
    """A partitioned sink's partitions to commit after this batch, and those left pending; the
    partitions' times are read in the session's time zone unless the table names one."""
    if not isinstance(sink, CommitsPartitions) or sink.partition_commit is None:
        return {}
    policy = sink.partition_commit
    if policy.time_zone is None:
        policy = dataclasses.replace(policy, time_zone=spark.conf.get("spark.sql.session.timeZone"))
    watermark = None if time_now.watermark == NO_WATERMARK else time_now.watermark
    commit, pending = policy.due(
        list((previous or {}).get("pending", [])), sink.partitions(moves), watermark, time_now.processing_time,
        time_now.end_of_input,
    )  # fmt: skip
    return {"commit": commit, "pending": pending}


def _late_counts(builder: FrameBuilder) -> dict[str, int]:
    """Late rows each window dropped (it has no late_rows sink), where any were."""
    counts: dict[str, int] = {}
    for name, count in builder.late_counts:
        counts[name] = counts.get(name, 0) + count()
    return {name: rows for name, rows in counts.items() if rows}


def _observed_rows(observations: list[Observation]) -> int | None:
    try:
        return sum(int(observation.get.get("rows", 0)) for observation in observations)
    except Exception:  # Spark's adaptive execution may prune the observed node of an empty stage
        return None


def publish(plan: CompiledPlan, manifest: Manifest) -> None:
    """Make a committed version's staged output visible, sink by sink (idempotent)."""
    outputs = plan.outputs()
    for staged in manifest.sinks:
        if staged["uid"] not in outputs and any(exists(*filesystem(source)) for source, _ in staged["moves"]):
            raise RestoreError(
                f"checkpoint version {manifest.version} holds committed output of sink uid {staged['uid']!r} that "
                "is not yet published, and this pipeline has no sink with that uid; run the pipeline that wrote it "
                "once more (it publishes on start), then change the pipeline"
            )
        if staged["uid"] in outputs:
            sink = outputs[staged["uid"]][1]
            sink.publish(staged["moves"])
            if staged.get("commit") and isinstance(sink, CommitsPartitions):
                sink.commit_partitions(staged["commit"])
