"""A running streaming job: start the query, run each micro-batch, rescale between them, stop.

Parallelism is read at every batch boundary: a ``rescale(n)`` or an adaptive scheduler
decision recompiles the plan at ``n`` (``CompiledPlan.rescaled``) and the next micro-batch
runs at it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from keyflow.config import CHECKPOINTING_INTERVAL
from keyflow.connectors.base import SPLIT_COLUMN, SplitSource
from keyflow.errors import (
    CheckpointError,
    DamagedFileError,
    KeyflowError,
    PlanError,
    is_positive_int,
)
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.paths import unlock
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.nodes import SourceNode
from keyflow.runtime import object_store
from keyflow.runtime.autoscale import Autoscaler
from keyflow.runtime.errors import guarded, translate
from keyflow.runtime.frames import session_for
from keyflow.runtime.streaming import restore
from keyflow.runtime.streaming.commit import StreamState, commit_micro_batch
from keyflow.runtime.streaming.faults import fault
from keyflow.runtime.streaming.inputs import tagged_union
from keyflow.runtime.streaming.prekeyed import PreKeyedSource
from keyflow.runtime.streaming.prepare import prepare
from keyflow.runtime.streaming.results import BatchMetrics, StreamingResult
from keyflow.state.integrity import damaged_while_reading
from keyflow.state.rollback import forget_uncommitted
from keyflow.state.source_log import SourceLog


class StreamingJob:
    """A running streaming pipeline: ``status``, ``last_batch``, ``rescale(n)``, ``stop()``."""

    def __init__(
        self,
        plan: CompiledPlan,
        checkpoint: str,
        available_now: bool,
        on_batch: Callable[[BatchMetrics], None] | None = None,
    ) -> None:
        self.available_now, self._on_batch = available_now, on_batch
        object_store.export(plan.config)
        self.checkpoint = object_store.opened(checkpoint)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._requested: tuple[int, str] | None = None
        self._pending_event: dict[str, Any] | None = None  # logged once a batch commits at the new parallelism
        self._stopping = self._stopped = False
        self._stop_lock = threading.Lock()
        self.run_id = uuid.uuid4().hex
        self._sources = restore.streaming_sources(plan)
        self._autoscaler: Autoscaler | None = None
        self._held = self.checkpoint.acquire()
        try:
            self._source_log = SourceLog(self.checkpoint)
            with self.checkpoint.storage("restoring"):
                restored = restore.restore(plan, self.checkpoint)
            try:
                self._pre_keyed = PreKeyedSource.of(restored.plan, self._sources, self.checkpoint, restored.manifest)
            except DamagedFileError as damage:  # a split index whose content was altered
                raise damaged_while_reading(self.checkpoint, damage) from None
            self._stream = StreamState(
                restored.plan, self.checkpoint, restored.plan_file, self.run_id, tuple(s.id for s in self._sources),
                restored.manifest, self._source_log, self._pre_keyed, restored.retained,
            )  # fmt: skip
            if restored.manifest is not None and restored.manifest.parallelism != self.plan.parallelism:
                self._pending_event = _rescale_event(restored.manifest.parallelism, self.plan.parallelism, "restart")
            self.result = StreamingResult(self.plan.graph, checkpoint)
            self._query = self._start()
            if self._autoscaler is not None:
                self._autoscaler.start_polling(self._scheduler_failed)
        except BaseException as error:
            if hasattr(self, "_query"):  # started, then failed (the scheduler's polling): stop it first
                self._query.stop()
            if hasattr(self, "_source_log"):
                self._source_log.close()
            if self._autoscaler is not None:
                self._autoscaler.close("canceled" if isinstance(error, KeyboardInterrupt) else "failed", error)
            unlock(self._held)
            raise

    # -- public handle ---------------------------------------------------------------------
    @property
    def plan(self) -> CompiledPlan:
        """The plan the next micro-batch runs."""
        return self._stream.plan

    @property
    def status(self) -> str:
        if self._error is not None:
            return "failed"
        return "running" if self._query.isActive else "stopped"

    @property
    def parallelism(self) -> int:
        return self.plan.parallelism

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
        if not is_positive_int(parallelism):
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
                with contextlib.suppress(OSError, CheckpointError):  # Spark's commit of the last batch: if
                    # lost it is replayed; not pushed if another job committed since (a driver cut off)
                    self.checkpoint.manifests.check_uncommitted(self._stream.committed + 1)
                    self._source_log.push()
            finally:
                self._source_log.close()
                if self._autoscaler is not None:
                    outcome = "failed" if self._error is not None else "finished" if ended else "canceled"
                    self._autoscaler.close(outcome, self._error)
                unlock(self._held)

    def _guard(self, action: Callable[[], Any]) -> Any:
        try:
            result = action()
        except Exception as error:
            if self._stopping and self._error is None:
                return None
            raise (self._error or translate(error, "in the streaming query")) from None
        if self._error is not None:
            raise self._error
        return result

    # -- start -----------------------------------------------------------------------------
    def _start(self) -> StreamingQuery:
        spark = session_for(self.plan)
        object_store.share_with_workers(spark.sparkContext, self.checkpoint.on_object_store)
        self._autoscaler = Autoscaler.from_config(
            self.plan.config, spark.sparkContext, self.plan.max_parallelism, self.checkpoint, self.run_id
        )
        if self._autoscaler is not None:  # like Flink: wait for resources, then run at what is there
            self._replan(*self._autoscaler.wait_until_executing())
        frames = [self._read_stream(spark, source) for source in self._sources]
        plan_file = restore.check_source_schemas(
            self.checkpoint,
            self._stream.plan_file,
            {
                self.plan.uid(source.id): (
                    source.name,
                    frame.drop(KEY_GROUP_COLUMN, SPLIT_COLUMN).schema.simpleString(),
                )
                for source, frame in zip(self._sources, frames, strict=True)
            },
        )
        schemas = {source.id: frame.schema for source, frame in zip(self._sources, frames, strict=True)}
        self._stream = dataclasses.replace(self._stream, plan_file=prepare(self._stream, plan_file, spark, schemas))
        stream = tagged_union(frames)
        with self.checkpoint.storage("reading Spark's source log"):
            self._source_log.pull()
        writer = stream.writeStream.foreachBatch(self._run_batch).option(
            "checkpointLocation", self._source_log.location
        )
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.plan.config.get(CHECKPOINTING_INTERVAL)} seconds")
        return writer.start()

    def _read_stream(self, spark: SparkSession, node: SourceNode) -> DataFrame:
        source, extra = node.source, dict[str, Any]()
        if self._pre_keyed is not None and self._pre_keyed.source_id == node.id:
            self._pre_keyed.prepare(self.plan)
            extra["layout"] = self._pre_keyed.layout
        if node.watermark is not None and isinstance(source, SplitSource):
            extra["split_column"] = True  # watermarks per split
        parallelism = self.plan.operator(node.id).parallelism
        return guarded(lambda: source.read_stream(spark, parallelism, **extra), f"while starting {node.name!r}")

    def _scheduler_failed(self, error: Exception) -> None:
        """No executor cores for the resource-wait timeout: the job stops with that error."""
        self._error = error
        self._query.stop()

    # -- one micro-batch -------------------------------------------------------------------
    def _run_batch(self, frame: DataFrame, batch: int) -> None:
        try:
            self._batch(frame, batch)
        except BaseException as error:
            if not self._stopping and self._error is None:
                self._error = error if isinstance(error, KeyflowError) else translate(error, f"in micro-batch {batch}")
                self._explain_damage(self._error)
            raise

    def _explain_damage(self, error: BaseException) -> None:
        """A state file a worker found damaged: name the newest intact version and the way back,
        and remove what this micro-batch wrote, so the checkpoint is as it was."""
        if isinstance(error, DamagedFileError):
            if self.checkpoint.manifests.versions()[-1:] == [self._stream.committed]:  # nothing of this batch committed
                forget_uncommitted(self.checkpoint, self._stream.committed)
            self._error = damaged_while_reading(self.checkpoint, error)

    def _batch(self, frame: DataFrame, batch: int) -> None:
        if batch <= self._stream.committed:
            return  # committed before a crash; Spark replays it because its own commit was lost
        fault("start", batch)
        if self._pre_keyed is None:
            self._apply_rescale()
        self._stream, metrics = commit_micro_batch(
            self._stream, frame, batch, self._pending_event, not self.result.batches
        )
        self._pending_event = None
        if self._pre_keyed is not None:
            # Spark plans a micro-batch's source partitions before running it: a pre-keyed source
            # lays out the next batch now, for the parallelism it will run at.
            self._apply_rescale()
            self._pre_keyed.prepare(self.plan)
        self.result.batches.append(metrics)
        if self._on_batch is not None:
            self._on_batch(metrics)

    # -- rescale ---------------------------------------------------------------------------
    def _apply_rescale(self) -> None:
        """At a batch boundary: the parallelism the adaptive scheduler decides, else a rescale(n)."""
        if self._autoscaler is not None:
            self._autoscaler.poll()
            requested = self._autoscaler.decision()
        else:
            with self._lock:
                requested, self._requested = self._requested, None
        if requested is not None and requested[0] != self.plan.parallelism:
            self._replan(*requested)

    def _replan(self, parallelism: int, reason: str) -> None:
        self._stream = dataclasses.replace(self._stream, plan=self.plan.rescaled(parallelism))
        self.result.plan = self.plan.graph
        manifest = self._stream.manifest
        committed_at = manifest.parallelism if manifest else parallelism  # no state yet: no rescale
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
