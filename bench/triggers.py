"""Spark's own timing of streaming micro-batches, for benchmarks that compare keyflow's query
with Spark's: both are timed by the same listener, with the same measure."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener
from typing_extensions import override


class Triggers(StreamingQueryListener):
    """Start time, ``triggerExecution`` and input rows of every micro-batch of every query, as
    Spark's listener bus reports them: the same measure for keyflow's query and Spark's own."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.batches: dict[tuple[str, int], tuple[float, float, int]] = {}
        self._attached = False

    def attach(self, spark: SparkSession) -> None:
        """Listen to ``spark``'s queries (once: a second listener would report each twice)."""
        if not self._attached:
            spark.streams.addListener(self)
            self._attached = True

    @override
    def onQueryStarted(self, event: Any) -> None:
        self.queries.append(str(event.id))

    @override
    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        started = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        self.batches[(str(p.id), p.batchId)] = (started, p.durationMs["triggerExecution"] / 1000, p.numInputRows)

    @override
    def onQueryIdle(self, event: Any) -> None:
        return None

    @override
    def onQueryTerminated(self, event: Any) -> None:
        return None

    def of(self, query: str, timeout: float = 30.0, at_least: int = 0) -> list[tuple[float, float, int]]:
        """``(start, seconds, input rows)`` of each micro-batch of ``query``, in order, once the
        bus has delivered them (``at_least`` batches)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted((b, v) for (q, b), v in self.batches.items() if q == query)
            if len(found) >= at_least and [b for b, _ in found] == list(range(len(found))):
                return [v for _, v in found]
            time.sleep(0.05)
        raise RuntimeError(f"the listener did not report {at_least} micro-batches of query {query}")

    def seconds(self, query: str, batches: list[int], timeout: float = 30.0) -> list[float]:
        """``triggerExecution`` of ``batches`` of ``query``, once the bus has delivered them."""
        deadline = time.monotonic() + timeout
        while any((query, b) not in self.batches for b in batches) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [self.batches[(query, b)][1] for b in batches]
