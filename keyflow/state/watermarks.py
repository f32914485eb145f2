"""A streaming source's watermark between micro-batches, as the checkpoint keeps it. Pure.

Generated per split and combined by minimum, as Flink's ``WatermarkOutputMultiplexer``: each
split's watermark is its largest event time minus the bound, minus 1; the source's is the
smallest over the splits that are not idle. A split is idle after ``idleness`` of processing
time without rows (Flink's ``WatermarksWithIdleness``); without an idleness timeout a split
that has no rows holds the watermark back, as in Flink. When every split is idle the
watermark stays. It never goes back. Idleness is measured within a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyflow.plan.event_time import NO_WATERMARK, WatermarkStrategy


@dataclass(frozen=True)
class SourceWatermark:
    """Per split: the largest event time seen (None: no row yet) and the processing time (seconds)
    it last had rows, or was first seen; ``watermark``: the combined watermark now."""

    splits: dict[int, tuple[int | None, float]] = field(default_factory=dict)
    watermark: int = NO_WATERMARK

    def advance(
        self,
        strategy: WatermarkStrategy,
        split_count: int,
        observed: Mapping[int, int],
        now: float,
        restarted: bool = False,
    ) -> SourceWatermark:
        """After a micro-batch in which split ``s`` had rows up to event time ``observed[s]``;
        ``restarted``: the first micro-batch of a run, where idleness starts over (as Flink's
        idleness timers, which are not checkpointed: the time a job was down is not idleness)."""
        splits = {s: (latest, now) for s, (latest, _) in self.splits.items()} if restarted else dict(self.splits)
        for split in range(split_count):
            latest, active = splits.get(split, (None, now))
            if split in observed:
                latest, active = observed[split] if latest is None else max(latest, observed[split]), now
            splits[split] = (latest, active)
        holding = [
            latest
            for latest, active in splits.values()
            if strategy.idleness is None or (now - active) * 1_000_000 < strategy.idleness
        ]
        watermark = self.watermark
        if holding:
            lowest = min((NO_WATERMARK if latest is None else latest) for latest in holding)
            if lowest != NO_WATERMARK:
                watermark = max(watermark, lowest - strategy.out_of_orderness - 1)
        return SourceWatermark(splits, watermark)

    def idle_splits(self, strategy: WatermarkStrategy, now: float) -> list[int]:
        if strategy.idleness is None:
            return []
        return sorted(s for s, (_, active) in self.splits.items() if (now - active) * 1_000_000 >= strategy.idleness)

    def to_dict(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "splits": {str(s): list(v) for s, v in sorted(self.splits.items())}}

    @staticmethod
    def from_dict(data: Mapping[str, Any] | None) -> SourceWatermark:
        if not data:
            return SourceWatermark()
        splits = {int(s): (None if v[0] is None else int(v[0]), float(v[1])) for s, v in data["splits"].items()}
        return SourceWatermark(splits, int(data["watermark"]))
