"""Streaming: the same operators, run per micro-batch by Structured Streaming's ``foreachBatch``.

Each micro-batch is one checkpoint version, committed in this order::

    keyed operators run (each subtask writes its state file for the version)
    sinks write the batch under a staging directory
    the manifest of the version is written (atomically): the commit point
    staged sink files are moved into place; old versions are deleted

A crash before the commit leaves the previous version intact: Spark replays the batch
(same offsets), which rewrites the same files. A crash after it is finished on restart
(the moves are repeated) and the replayed batch is skipped. So state and file sinks are
exactly-once. Parallelism is read at every batch boundary: a rescale only changes which
key-group ranges the next batch's subtasks restore; no state file is rewritten.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyarrow import fs
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from keyflow.api import nodes
from keyflow.errors import KeyflowError, PlanError
from keyflow.keygroups import key_group_range
from keyflow.paths import unlock
from keyflow.plan.compile import compile_plan
from keyflow.plan.graph import JobGraph
from keyflow.plan.restore import check_restorable, keyed_operators
from keyflow.runtime.autoscale import Autoscaler
from keyflow.runtime.errors import translate
from keyflow.runtime.executor import FrameBuilder, pipeline_session
from keyflow.state.checkpoint import (
    LOCK_FILE,
    Checkpoint,
    CheckpointError,
    Manifest,
    StateFile,
    delta_depth,
    needed_files,
)
from keyflow.state.durable import CheckpointedState

if TYPE_CHECKING:
    from keyflow.api.pipeline import Pipeline

FAULT_ENV = "KEYFLOW_FAULT"  # "<point>:<batch>": SIGKILL this process there (crash tests)


@dataclass(frozen=True)
class BatchMetrics:
    """One committed micro-batch."""

    batch: int
    parallelism: int
    input_rows: int | None  # None where Spark dropped the count (a batch its optimizer found empty downstream)
    output_rows: dict[str, int]
    state_files: int
    state_bytes_written: int
    seconds: float


@dataclass
class StreamingResult:
    """What a streaming run did until it stopped."""

    plan: JobGraph
    checkpoint: str
    batches: list[BatchMetrics] = field(default_factory=list)

    @property
    def output_rows(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for batch in self.batches:
            for sink, rows in batch.output_rows.items():
                totals[sink] = totals.get(sink, 0) + rows
        return totals


class StreamingJob:
    """A running streaming pipeline: ``status``, ``last_batch``, ``rescale(n)``, ``stop()``."""

    def __init__(
        self,
        pipeline: Pipeline,
        checkpoint: str,
        available_now: bool,
        on_batch: Callable[[BatchMetrics], None] | None = None,
    ) -> None:
        self.pipeline, self.available_now, self._on_batch = pipeline, available_now, on_batch
        self.checkpoint = Checkpoint(checkpoint)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._requested: tuple[int, str] | None = None
        self._pending_event: dict[str, Any] | None = None  # logged once a batch commits at the new parallelism
        self._stopping = self._stopped = False
        self._stop_lock = threading.Lock()
        self._key_types_checked = False
        self.run_id = uuid.uuid4().hex
        self._nodes = _nodes_by_uid(pipeline.sinks)
        self._autoscaler: Autoscaler | None = None
        try:
            self._held = self.checkpoint.acquire()
        except CheckpointError as error:
            raise PlanError(str(error)) from None
        try:
            self._prepare()
            self.result = StreamingResult(self.plan, checkpoint)
            self._query = self._start()
            if self._autoscaler is not None:
                self._autoscaler.start_polling(self._scheduler_failed)
        except BaseException as error:
            if self._autoscaler is not None:
                self._autoscaler.close("canceled" if isinstance(error, KeyboardInterrupt) else "failed", error)
            unlock(self._held)
            raise

    # -- public handle ---------------------------------------------------------------------
    @property
    def status(self) -> str:
        if self._error is not None:
            return "failed"
        return "running" if self._query.isActive else "stopped"

    @property
    def parallelism(self) -> int:
        return self.plan.default_parallelism

    @property
    def last_batch(self) -> BatchMetrics | None:
        return self.result.batches[-1] if self.result.batches else None

    @property
    def scheduler_state(self) -> str | None:
        """The adaptive scheduler's state (``jobmanager.scheduler=adaptive``), else None."""
        return str(self._autoscaler.scheduler.state) if self._autoscaler is not None else None

    def rescale(self, parallelism: int, reason: str = "manual") -> None:
        """Run from the next micro-batch on at ``parallelism``; state is not moved or rewritten."""
        if self._autoscaler is not None:
            raise PlanError(
                "rescale() with jobmanager.scheduler=adaptive: the adaptive scheduler sets the parallelism "
                "from the executor cores; restart with parallelism.default=N (its upper bound) or with "
                "jobmanager.scheduler=default to choose it yourself"
            )
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise PlanError(f"rescale({parallelism!r}): parallelism must be a positive integer")
        if parallelism > self.plan.max_parallelism:
            raise PlanError(
                f"rescale({parallelism}) is above the checkpoint's max parallelism {self.plan.max_parallelism} "
                f"(its number of key groups); choose 1..{self.plan.max_parallelism}"
            )
        with self._lock:
            self._requested = (parallelism, reason)

    def process_all_available(self) -> None:
        """Block until every row available now is processed and committed."""
        self._guard(self._query.processAllAvailable)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (``available_now``: when the data is processed)."""
        return bool(self._guard(lambda: self._query.awaitTermination(timeout)))

    def stop(self) -> None:
        """Stop now; a micro-batch that is running is cancelled and not committed (it runs
        again on restart), what is committed stays committed."""
        with self._stop_lock:  # once, even when Ctrl-C's thread and the caller both stop
            if self._stopped:
                return
            self._stopped = self._stopping = True
            ended = False
            try:
                ended = not self._query.isActive
                self._query.stop()
            finally:
                if self._autoscaler is not None:
                    outcome = "failed" if self._error is not None else "finished" if ended else "canceled"
                    self._autoscaler.close(outcome, self._error)
                unlock(self._held)

    def _guard(self, action: Any) -> Any:
        try:
            result = action()
        except Exception as error:
            if self._stopping and self._error is None:
                return None
            raise (self._error or translate(error, "in the streaming query")) from None
        if self._error is not None:
            raise self._error
        return result

    # -- start and restore -----------------------------------------------------------------
    def _prepare(self) -> None:
        sources = nodes.source_nodes(self.pipeline.sinks)
        if len(sources) != 1 or not getattr(sources[0].source, "unbounded", False):
            raise PlanError(
                "a streaming run (run(checkpoint=...)) needs exactly one unbounded source, e.g. "
                "datagen(rows_per_second=...), files(..., watch=True) or log(...); "
                f"this pipeline has {[node.name for node in sources]}"
            )
        self._source = sources[0]
        saved = self.checkpoint.read_plan()
        config = self.pipeline.config
        if saved is None:
            self._check_empty()
            self.plan = compile_plan(self.pipeline.sinks, config)
            self.checkpoint_id = uuid.uuid4().hex
            self.checkpoint.write_plan({"checkpoint_id": self.checkpoint_id, "plan": self.plan.to_dict()})
            for sink in self._file_outputs():
                sink.reset()
            self.checkpoint.discard_after(None)
            self._manifest: Manifest | None = None
            return
        saved_plan = JobGraph.from_dict(saved["plan"])
        self.checkpoint_id = saved["checkpoint_id"]
        forced = config.merged({"pipeline.max-parallelism": saved_plan.max_parallelism})
        self.plan = _round_trip(compile_plan(self.pipeline.sinks, forced))
        check_restorable(
            saved_plan,
            self.plan,
            config["pipeline.max-parallelism"],
            config["execution.state-recovery.ignore-unclaimed-state"],
            self.checkpoint.uri,
        )
        try:
            self._manifest = self.checkpoint.latest()
        except CheckpointError as error:
            raise PlanError(f"{error}; restore with that keyflow version or use a new checkpoint") from None
        self._check_source_offsets()
        committed = self._manifest.version if self._manifest else -1
        if self._manifest is not None:
            _publish(self._manifest)
            if self._manifest.parallelism != self.plan.default_parallelism:
                self._pending_event = _rescale_event(
                    self._manifest.parallelism, self.plan.default_parallelism, "restart"
                )
        self.checkpoint.discard_after(committed if self._manifest else None)
        for sink in self._file_outputs():
            sink.discard_after(committed)  # output of batches after the checkpoint (e.g. restored from a copy)

    def _file_outputs(self) -> list[Any]:
        """Every sink a micro-batch writes to, dead-letter sinks included."""
        dead_letters = [n.on_null for n in self._nodes.values() if isinstance(n, nodes.KeyedNode) and n.on_null]
        return [sink.sink for sink in self.pipeline.sinks] + dead_letters

    def _check_empty(self) -> None:
        selector = fs.FileSelector(self.checkpoint.root, allow_not_found=True)
        if any(info.base_name != LOCK_FILE for info in self.checkpoint.fs.get_file_info(selector)):
            raise PlanError(
                f"{self.checkpoint.uri} is not empty and has no keyflow plan.json, so it is not a keyflow "
                "checkpoint; give an empty or new directory"
            )

    def _check_source_offsets(self) -> None:
        """Spark's source log and the state must describe the same batches: every batch Spark
        committed has a manifest, and the newest manifest's batch is in Spark's offset log
        (its commit may be missing: a crash between the two commits replays it)."""
        committed = self._manifest.version if self._manifest else -1
        consumed = self._newest_batch("source/commits")
        planned = self._newest_batch("source/offsets")
        if consumed > committed:
            raise PlanError(
                f"checkpoint {self.checkpoint.uri}: the source has consumed batch {consumed} but the newest "
                f"state manifest is version {committed}; manifests were deleted. Restore the missing "
                "manifests, or start over with a new checkpoint directory"
            )
        if planned < committed:
            raise PlanError(
                f"checkpoint {self.checkpoint.uri}: the state is at micro-batch {committed} but Spark's source "
                f"checkpoint ({self.checkpoint.path('source')}) only knows batches up to {planned}; it was "
                "deleted or replaced, and new input would be skipped. Restore it, or start over with a new "
                "checkpoint directory"
            )

    def _newest_batch(self, relative: str) -> int:
        selector = fs.FileSelector(self.checkpoint.path(relative), allow_not_found=True)
        return max((int(i.base_name) for i in self.checkpoint.fs.get_file_info(selector) if i.base_name.isdigit()),
                   default=-1)  # fmt: skip

    def _start(self) -> Any:
        spark = pipeline_session(self.pipeline, self.plan)
        self._autoscaler = Autoscaler.from_config(
            self.pipeline.config, spark.sparkContext, self.plan.max_parallelism, self.checkpoint, self.run_id
        )
        if self._autoscaler is not None:  # like Flink: wait for resources, then run at what is there
            self._replan(*self._autoscaler.wait_until_executing())
        operator = self.plan.operator(self._source.uid)
        stream = self._guard_plan(lambda: self._source.source.read_stream(spark, operator.parallelism))
        self._check_source_schema(stream.schema.simpleString())
        location = self.checkpoint.uri.rstrip("/") + "/source" if "://" in self.checkpoint.uri else None
        writer = stream.writeStream.foreachBatch(self._run_batch).option(
            "checkpointLocation", location or self.checkpoint.path("source")
        )
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(
                processingTime=f"{self.pipeline.config['execution.checkpointing.interval']} seconds"
            )
        return writer.start()

    def _scheduler_failed(self, error: Exception) -> None:
        """No executor cores for the resource-wait timeout: the job stops with that error."""
        self._error = error
        self._query.stop()

    def _fixed_by_first_run(self, field: str, value: Any) -> Any:
        """What ``field`` was when the checkpoint's first run recorded it in plan.json (this
        run records ``value`` if none did yet): facts later runs must not change."""
        saved = self.checkpoint.read_plan() or {}
        if field not in saved:
            self.checkpoint.write_plan({**saved, field: value})
            return value
        return saved[field]

    def _check_source_schema(self, schema: str) -> None:
        """The source's columns are fixed by the first run (an inferred schema could drift)."""
        recorded = self._fixed_by_first_run("source_schema", schema)
        if recorded != schema:
            raise PlanError(
                f"source {self._source.name!r} now reads {schema} but checkpoint {self.checkpoint.uri} was "
                f"started with {recorded}; give the source that schema explicitly (files(..., schema=...)) "
                "or start a new checkpoint"
            )

    def _guard_plan(self, action: Any) -> Any:
        try:
            return action()
        except KeyflowError:
            raise
        except Exception as error:
            raise translate(error, f"while starting {self._source.name!r}") from None

    # -- one micro-batch -------------------------------------------------------------------
    def _run_batch(self, frame: DataFrame, batch: int) -> None:
        try:
            self._batch(frame, batch)
        except BaseException as error:
            if not self._stopping and self._error is None:
                self._error = error if isinstance(error, KeyflowError) else translate(error, f"in micro-batch {batch}")
            raise

    def _batch(self, frame: DataFrame, batch: int) -> None:
        committed = self._manifest.version if self._manifest else -1
        if batch <= committed:
            return  # committed before a crash; Spark replays it because its own commit was lost
        started = time.perf_counter()
        _fault("start", batch)
        self._apply_rescale()
        plan = self.plan
        spark = frame.sparkSession
        spark.conf.set("spark.sql.shuffle.partitions", str(plan.default_parallelism))
        backends = self._backends(batch, committed)
        observation = Observation()
        source = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
        builder = FrameBuilder(
            spark, plan, self.pipeline.config["pipeline.null-keys"], self.pipeline.sinks, {self._source.uid: source},
            backends,
        )  # fmt: skip
        try:
            if not self._key_types_checked:
                for uid in backends:
                    builder.frame(self._nodes[uid])  # lazy: builds the DataFrame, runs nothing
                self._check_key_types({uid: builder.key_types(uid) for uid in backends})
            # Every sink consumes its input in full, so each keyed subtask runs to its end and
            # writes its state file once (operators read by several sinks are persisted).
            outputs: dict[str, int] = {}
            moves: list[list[str]] = []
            for sink in self.pipeline.sinks:
                sink_frame = builder.frame(sink)
                rows, staged = builder.guarded(lambda f=sink_frame, s=sink: s.sink.stage(f, batch), sink)
                outputs[sink.name], moves = rows, moves + staged
            for node, letters in builder.take_dead_letters():
                rows, staged = builder.guarded(lambda f=letters, n=node: n.on_null.stage(f, batch), node)
                outputs[f"dead letters of {node.name!r}"], moves = rows, moves + staged
            _fault("after-sink-write", batch)
            operators = {}
            written: list[StateFile] = []
            for uid in backends:
                # A subtask Spark skipped (no input rows: adaptive execution drops empty
                # stages) wrote no file: its state did not change.
                new = self.checkpoint.written_files(str(uid), batch)
                written += new
                previous = self._manifest.operators.get(str(uid), []) if self._manifest else []
                operators[str(uid)] = needed_files([*previous, *new], plan.max_parallelism)
            manifest = Manifest(batch, plan.default_parallelism, plan.max_parallelism, operators, [{"moves": moves}])
            self.checkpoint.commit(manifest)
            self._manifest = manifest
            if self._pending_event is not None:
                self.checkpoint.append_event({**self._pending_event, "batch": batch})
                self._pending_event = None
            _fault("after-commit", batch)
            _publish(manifest)
            _fault("after-publish", batch)
            self.checkpoint.retain(self.pipeline.config["state.checkpoints.num-retained"])
        finally:
            builder.release()
        input_rows = _observed_rows(observation)
        metrics = BatchMetrics(
            batch, plan.default_parallelism, input_rows, outputs, len(written),
            sum(f.bytes for f in written), time.perf_counter() - started,
        )  # fmt: skip
        self.result.batches.append(metrics)
        if self._on_batch is not None:
            self._on_batch(metrics)

    def _check_key_types(self, current: dict[int, dict[str, str]]) -> None:
        """Key types are part of the state's identity (they decide the hash): the first
        micro-batch records them in plan.json, every restore must match them."""
        now = {str(uid): types for uid, types in current.items()}
        recorded = self._fixed_by_first_run("key_types", now)
        for uid, types in now.items():
            if uid in recorded and recorded[uid] != types:
                raise PlanError(
                    f"operator {self._nodes[int(uid)].name!r}: key columns are now {types} but checkpoint "
                    f"{self.checkpoint.uri} holds state keyed by {recorded[uid]}; the same keys would hash to "
                    "other key groups. Cast the keys back to those types, or start a new checkpoint"
                )
        self._key_types_checked = True

    def _backends(self, batch: int, committed: int) -> dict[int, CheckpointedState]:
        plan, limit = self.plan, self.pipeline.config["state.compaction.max-deltas"]
        backends = {}
        for uid, operator in keyed_operators(plan).items():
            files = tuple(self._manifest.operators.get(str(uid), [])) if self._manifest else ()
            depth = delta_depth(files, plan.max_parallelism)
            compact = frozenset(
                subtask
                for subtask in range(operator.parallelism)
                if _range_max(depth, key_group_range(plan.max_parallelism, operator.parallelism, subtask)) >= limit
            )
            backends[uid] = CheckpointedState(
                self.checkpoint.uri, self.checkpoint_id, self.run_id, str(uid), committed, batch, files, compact,
                plan.max_parallelism,
            )  # fmt: skip
        return backends

    def _apply_rescale(self) -> None:
        """At a batch boundary: the parallelism the adaptive scheduler decides, else a rescale(n)."""
        if self._autoscaler is not None:
            self._autoscaler.poll()
            requested = self._autoscaler.decision()
        else:
            with self._lock:
                requested, self._requested = self._requested, None
        if requested is not None and requested[0] != self.plan.default_parallelism:
            self._replan(*requested)

    def _replan(self, parallelism: int, reason: str) -> None:
        config = self.pipeline.config.merged(
            {"parallelism.default": parallelism, "pipeline.max-parallelism": self.plan.max_parallelism}
        )
        self.plan = _round_trip(compile_plan(self.pipeline.sinks, config))
        self.result.plan = self.plan
        committed_at = self._manifest.parallelism if self._manifest else parallelism  # no state yet: no rescale
        changed = committed_at != parallelism
        self._pending_event = _rescale_event(committed_at, parallelism, reason) if changed else None


def _rescale_event(before: int, after: int, reason: str) -> dict[str, Any]:
    """A parallelism change; its ``batch`` is filled in when the first batch at ``after`` commits."""
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "event": "rescale",
        "from": before,
        "to": after,
        "reason": reason,
    }


def run_streaming(
    pipeline: Pipeline,
    checkpoint: str,
    available_now: bool,
    on_batch: Callable[[BatchMetrics], None] | None = None,
) -> StreamingResult:
    """Run until the available data is processed (``available_now``) or until interrupted.

    Ctrl-C stops the query from another thread (PySpark's own handler would interrupt a py4j
    call half-way and print its tracebacks); a second Ctrl-C leaves at once (the process's
    end releases the checkpoint; the cancelled micro-batch reruns on restart)."""
    job = StreamingJob(pipeline, checkpoint, available_now, on_batch)
    previous, stopping = None, threading.Event()
    if threading.current_thread() is threading.main_thread():

        def interrupt(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            stopping.set()
            threading.Thread(target=job.stop, name="keyflow-stop", daemon=True).start()

        previous = signal.signal(signal.SIGINT, interrupt)
    try:
        job.await_termination()
    except KeyboardInterrupt:
        if stopping.is_set():
            raise
    except BaseException:
        job.stop()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    job.stop()
    return job.result


def _observed_rows(observation: Observation) -> int | None:
    try:
        return int(observation.get.get("rows", 0))
    except Exception:  # Spark's adaptive execution may prune the observed node of an empty stage
        return None


def _range_max(depth: Any, key_group_range: tuple[int, int]) -> int:
    first, last = key_group_range
    return int(depth[first : last + 1].max(initial=0))


def _publish(manifest: Manifest) -> None:
    from keyflow.connectors.files import publish

    for sink in manifest.sinks:
        publish(sink["moves"])


def _round_trip(plan: JobGraph) -> JobGraph:
    """The plan as it reads back from JSON, so it compares equal to a persisted one."""
    return JobGraph.from_dict(json.loads(plan.to_json()))


def _nodes_by_uid(sinks: list[nodes.SinkNode]) -> dict[int, nodes.Node]:
    return {node.uid: node for node in sorted(nodes.upstream_nodes(sinks), key=lambda node: node.uid)}


def _fault(point: str, batch: int) -> None:
    """Crash tests: ``KEYFLOW_FAULT=after-commit:2`` kills this process (SIGKILL, no clean-up)
    at that point of micro-batch 2, like a lost driver."""
    if os.environ.get(FAULT_ENV) == f"{point}:{batch}":
        os.kill(os.getpid(), signal.SIGKILL)
