"""The adaptive scheduler on Spark: executor cores in, parallelism decisions out.

A daemon thread samples the cores Spark's scheduler backend holds (local: the ``local[N]``
cores; standalone, YARN, Kubernetes: the cores of registered executors) twice a second, and
the streaming driver samples again at every micro-batch boundary, where it applies the
scheduler's parallelism with the live rescale. Every change of slots and every decision is
appended to ``scheduler.jsonl`` next to the checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark import SparkContext

from keyflow.config import SCHEDULER, Config
from keyflow.errors import EngineError
from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig, State
from keyflow.scheduler.timeline import LOG_FILE, decision_record, resources_record, start_record
from keyflow.state.checkpoint import Checkpoint

POLL_SECONDS = 0.5
FAILED_POLLS = 20  # ten seconds of errors reading Spark's executors stop the job


class SparkSlots:
    """Task slots (executor cores / ``spark.task.cpus``) and executor ids, read from the
    driver's scheduler backend over py4j."""

    def __init__(self, context: SparkContext) -> None:
        self._context = context._jsc.sc()  # type: ignore[union-attr]
        self._cores_per_task = int(context.getConf().get("spark.task.cpus", "1"))

    def sample(self) -> tuple[int, frozenset[str]]:
        backend = self._context.schedulerBackend()
        if backend.getClass().getSimpleName() == "LocalSchedulerBackend":
            return int(backend.totalCores()) // self._cores_per_task, frozenset({"driver"})
        executors = frozenset(filter(None, self._context.getExecutorIds().mkString(",").split(",")))
        return int(backend.totalCoreCount()) // self._cores_per_task, executors


class Autoscaler:
    """Feeds Spark's slots to an :class:`AdaptiveScheduler` and logs what it decides."""

    def __init__(
        self,
        scheduler: AdaptiveScheduler,
        slots: Callable[[], tuple[int, frozenset[str]]],
        checkpoint: Checkpoint,
        run_id: str,
    ) -> None:
        self.scheduler, self._slots, self._checkpoint = scheduler, slots, checkpoint
        self._lock = threading.RLock()
        self._executors: frozenset[str] = frozenset()
        self._logged = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._write([start_record(scheduler.clock(), scheduler.config, run_id)])

    @staticmethod
    def from_config(
        config: Config, context: SparkContext, max_parallelism: int, checkpoint: Checkpoint, run_id: str
    ) -> Autoscaler | None:
        """An autoscaler if ``jobmanager.scheduler`` is ``adaptive``; the configured parallelism
        (if any) is its upper bound."""
        if config.get(SCHEDULER) != "adaptive":
            return None
        options = SchedulerConfig.from_config(config, max_parallelism)
        return Autoscaler(AdaptiveScheduler(options, time.time), SparkSlots(context).sample, checkpoint, run_id)

    def wait_until_executing(self) -> tuple[int, str]:
        """Block until the scheduler first runs the job (resources stable, or all it can use
        there); the parallelism to start at and why."""
        with self._lock:
            self.scheduler.start()
        while True:
            state = self.poll()
            decided = self.decision()
            if decided is not None:
                return decided
            if state is State.FINISHED:
                raise self.failure()
            time.sleep(POLL_SECONDS / 5)

    def start_polling(self, on_failure: Callable[[Exception], None]) -> None:
        """Poll in a daemon thread; ``on_failure`` gets the error that ends the job: no slots
        for the wait timeout, or Spark's executors unreadable for ``FAILED_POLLS`` polls in a row."""

        def loop() -> None:
            errors = 0
            while not self._stopped.wait(POLL_SECONDS):
                try:
                    state, errors = self.poll(), 0
                except Exception as error:  # one bad read must not end the polling
                    errors += 1
                    if errors >= FAILED_POLLS:
                        on_failure(EngineError(f"the adaptive scheduler cannot read Spark's executors: {error}"))
                        return
                    continue
                if state is State.FINISHED:
                    on_failure(self.failure())
                    return

        self._thread = threading.Thread(target=loop, name="keyflow-autoscaler", daemon=True)
        self._thread.start()

    def poll(self) -> State:
        """Sample the slots, advance the timers, log what changed; the scheduler's state."""
        with self._lock:
            if self.scheduler.state is State.FINISHED:
                return State.FINISHED
            slots, executors = self._slots()
            records = self._new_decisions()  # from calls since the last poll (start, a batch's failure)
            if executors != self._executors or slots != self.scheduler.available:
                added, lost = sorted(executors - self._executors), sorted(self._executors - executors)
                records.append(resources_record(self.scheduler.clock(), slots, added, lost))
                self._executors = executors
                self.scheduler.on_resources(slots)  # advances the timers too
            else:
                self.scheduler.tick()
            self._write(records + self._new_decisions())
            return self.scheduler.state

    def decision(self) -> tuple[int, str] | None:
        """While Executing: the parallelism to run at and why (the latest change's reason, after
        the reason of the restart that led to it, if one did)."""
        with self._lock:
            if self.scheduler.state is not State.EXECUTING:
                return None
            events = self.scheduler.events
            index = len(events) - 1
            while index > 0 and events[index].parallelism_to == events[index].parallelism_from:
                index -= 1  # back to the latest change
            reasons = [events[index].reason]
            earlier = index - 1
            while earlier >= 0 and events[earlier].state is State.WAITING_FOR_RESOURCES:
                earlier -= 1
            if earlier >= 0 and events[earlier].state is State.RESTARTING:
                reasons.insert(0, events[earlier].reason)
            return self.scheduler.parallelism, f"adaptive scheduler: {'; '.join(reasons)}"

    def failure(self) -> Exception:
        timeout = self.scheduler.config.resource_wait_timeout
        return EngineError(
            f"the adaptive scheduler had no executor cores when the resource-wait-timeout ({timeout:g} s, "
            "jobmanager.adaptive-scheduler.resource-wait-timeout) ran out; the job stopped with its last checkpoint "
            "intact. Check that the cluster has workers and restart, or raise the timeout"
        )

    def close(self, outcome: str, error: object = None) -> None:
        """The job ended: ``finished``, ``canceled`` or ``failed``; the thread stops."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self.scheduler.state is not State.FINISHED:  # else it failed itself (no resources)
                if outcome == "failed":
                    self.scheduler.fail(error)
                elif outcome == "canceled":
                    self.scheduler.cancel()
                else:
                    self.scheduler.finish()
            self._write(self._new_decisions())

    def _new_decisions(self) -> list[dict[str, Any]]:
        events = self.scheduler.events[self._logged :]
        self._logged = len(self.scheduler.events)
        return [decision_record(event) for event in events]

    def _write(self, records: list[dict[str, Any]]) -> None:
        if records:
            self._checkpoint.append_lines(LOG_FILE, [json.dumps(record) for record in records])
