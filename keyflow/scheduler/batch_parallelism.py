"""Adaptive batch parallelism (FLIP-187): a keyed stage's parallelism decided from the bytes
it consumes, and the contiguous subpartition ranges its subtasks read. Pure: no Spark.

A keyed stage's input is written to the shuffle as *subpartitions* (contiguous blocks of key
groups). Once written, :func:`decide` takes the bytes of each subpartition and the bytes of
the stage's broadcast input and returns the parallelism and each subtask's range:

- parallelism, as Flink's ``DefaultVertexParallelismDecider`` (1.17+, no power-of-two
  rounding): broadcast bytes count up to ``max_broadcast_ratio`` x the volume per task ``V``,
  ``P = ceil(non_broadcast / (V - broadcast))``, clamped to ``[min, max]``; never more
  subtasks than subpartitions that hold data (a subtask with nothing to read is waste);
- ranges, either the seed's even split of subpartition indices or (the default) balanced by
  bytes: the contiguous split into ``P`` ranges whose largest range is smallest. A single
  subpartition above the mean load per subtask is reported: keyed state cannot be split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from keyflow.config import auto_parallelism_bounds
from keyflow.errors import KeyflowError

Range = tuple[int, int]  # inclusive (first, last) subpartition


@dataclass(frozen=True)
class AutoParallelism:
    """The ``execution.batch.adaptive.auto-parallelism.*`` options a decision depends on."""

    min_parallelism: int = 1
    max_parallelism: int = 128
    avg_data_volume_per_task: int = 16 * 1024 * 1024
    max_broadcast_ratio: float = 0.5
    balanced: bool = True  # ranges balanced by bytes; False: the seed's even split

    def __post_init__(self) -> None:
        """Messages name the option after its ``execution.batch.adaptive.auto-parallelism.`` prefix."""
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            raise KeyflowError(auto_parallelism_bounds(self.min_parallelism, self.max_parallelism))
        if self.avg_data_volume_per_task < 1:
            raise KeyflowError(f"avg-data-volume-per-task={self.avg_data_volume_per_task} must be at least 1 byte")
        if not 0 <= self.max_broadcast_ratio < 1:
            raise KeyflowError(f"max-broadcast-ratio={self.max_broadcast_ratio} must be in [0, 1)")


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` chose for one keyed stage, and why."""

    parallelism: int
    reason: str  # "formula", "min-parallelism", "max-parallelism" or "non-empty subpartitions"
    formula_parallelism: int  # ceil(non_broadcast / (V - counted broadcast)) before any bound
    input_bytes: int  # non-broadcast
    broadcast_bytes: int  # as consumed; the formula counts at most max_broadcast_ratio x V
    counted_broadcast_bytes: int
    ranges: tuple[Range, ...]  # subtask i reads subpartitions ranges[i] (inclusive)
    loads: tuple[int, ...]  # bytes each subtask reads
    oversized: tuple[int, ...]  # subpartitions holding more than the mean load per subtask

    @property
    def max_to_mean(self) -> float:
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean else 1.0


def decide_parallelism(
    non_broadcast_bytes: int, broadcast_bytes: int, options: AutoParallelism
) -> tuple[int, int, int, str]:
    """Flink's formula: ``(formula P, clamped P, counted broadcast bytes, reason)``."""
    volume = options.avg_data_volume_per_task
    counted = min(broadcast_bytes, math.ceil(volume * options.max_broadcast_ratio))
    formula = math.ceil(non_broadcast_bytes / (volume - counted))
    if formula < options.min_parallelism:
        return formula, options.min_parallelism, counted, "min-parallelism"
    if formula > options.max_parallelism:
        return formula, options.max_parallelism, counted, "max-parallelism"
    return formula, formula, counted, "formula"


def even_ranges(subpartitions: int, parallelism: int) -> list[Range]:
    """The seed's split: subtask ``k`` of ``P`` reads ``[floor(N*k/P), floor(N*(k+1)/P) - 1]``."""
    if not 1 <= parallelism <= subpartitions:
        raise KeyflowError(f"cannot split {subpartitions} subpartitions into {parallelism} ranges")
    return [(subpartitions * k // parallelism, subpartitions * (k + 1) // parallelism - 1) for k in range(parallelism)]


def balanced_ranges(loads: Sequence[int] | npt.NDArray[np.int64], parallelism: int) -> list[Range]:
    """``parallelism`` contiguous ranges covering every subpartition whose largest load is the
    smallest possible (the bottleneck of the linear partition problem), each holding at least
    one subpartition with data. Binary search on the bound; a greedy pass checks a bound."""
    weights = np.asarray(loads, dtype=np.int64)
    nonempty = int(np.count_nonzero(weights))
    if not 1 <= parallelism <= max(nonempty, 1) or parallelism > len(weights):
        raise KeyflowError(f"cannot split {nonempty} subpartitions with data into {parallelism} ranges")
    low, high = int(weights.max(initial=0)), int(weights.sum())
    while low < high:
        middle = (low + high) // 2
        if len(_greedy(weights, middle)) <= parallelism:
            high = middle
        else:
            low = middle + 1
    return _split_to(weights, _greedy(weights, low), parallelism)


def _greedy(weights: npt.NDArray[np.int64], bound: int) -> list[Range]:
    """Fewest ranges of load <= ``bound``, each extended as far as it goes (vectorised)."""
    ends = np.cumsum(weights)
    ranges, first = [], 0
    while first < len(weights):
        before = ends[first - 1] if first else 0
        last = max(int(np.searchsorted(ends, before + bound, side="right")) - 1, first)
        ranges.append((first, last))
        first = last + 1
    return ranges


def _split_to(weights: npt.NDArray[np.int64], ranges: list[Range], parallelism: int) -> list[Range]:
    """More ranges, up to ``parallelism``, by cutting the heaviest range with two or more
    subpartitions with data at its weighted middle; never raises the largest load."""
    ranges = list(ranges)
    while len(ranges) < parallelism:
        splittable = [
            (int(weights[first : last + 1].sum()), index)
            for index, (first, last) in enumerate(ranges)
            if np.count_nonzero(weights[first : last + 1]) > 1
        ]
        _, index = max(splittable)
        first, last = ranges[index]
        inside = np.cumsum(weights[first : last + 1])
        nonzero = np.flatnonzero(weights[first : last + 1])
        cut = int(np.searchsorted(inside, inside[-1] / 2))  # first subpartition reaching half the load
        cut = min(max(cut, int(nonzero[0])), int(nonzero[-1]) - 1)  # data on both sides
        ranges[index : index + 1] = [(first, first + cut), (first + cut + 1, last)]
    return ranges


def decide(subpartition_bytes: Sequence[int], broadcast_bytes: int, options: AutoParallelism) -> Decision:
    """Parallelism and ranges of one keyed stage from the bytes of its subpartitions."""
    weights = np.asarray(subpartition_bytes, dtype=np.int64)
    total = int(weights.sum())
    formula, parallelism, counted, reason = decide_parallelism(total, broadcast_bytes, options)
    nonempty = max(int(np.count_nonzero(weights)), 1)
    if parallelism > nonempty:
        parallelism, reason = nonempty, "non-empty subpartitions"
    if options.balanced and total:
        ranges = balanced_ranges(weights, parallelism)
    else:
        ranges = even_ranges(len(weights), parallelism)
    loads = tuple(int(weights[first : last + 1].sum()) for first, last in ranges)
    mean = total / parallelism
    oversized = tuple(int(index) for index in np.flatnonzero(weights > mean)) if parallelism > 1 else ()
    return Decision(parallelism, reason, formula, total, broadcast_bytes, counted, tuple(ranges), loads, oversized)
