"""What a streaming run reports: each committed micro-batch, and the run as a whole."""

from __future__ import annotations

from dataclasses import dataclass, field

from keyflow.plan.graph import JobGraph


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
    pre_keyed_conflicts: int = 0  # keys of a pre-keyed source seen in two splits (pipeline.pre-keyed.verify=warn)
    watermark: int | None = None  # the source's watermark after the batch, microseconds (None: none yet)
    late_rows_dropped: dict[str, int] = field(default_factory=dict)  # per window without a late_rows sink


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
