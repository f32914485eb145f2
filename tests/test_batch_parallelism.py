"""Adaptive batch parallelism, pure (``keyflow.scheduler.batch_parallelism``): the seed's
formulas on hand-computed cases, and balanced ranges against a brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from keyflow.errors import KeyflowError
from keyflow.scheduler.batch_parallelism import (
    AutoParallelism,
    balanced_ranges,
    decide,
    decide_parallelism,
    even_ranges,
)

MIB = 1024 * 1024
OPTIONS = AutoParallelism(min_parallelism=1, max_parallelism=8, avg_data_volume_per_task=16 * MIB)


@pytest.mark.parametrize(
    ("non_broadcast", "broadcast", "formula", "parallelism", "counted", "reason"),
    [
        (4 * MIB, 0, 1, 1, 0, "formula"),
        (64 * MIB, 0, 4, 4, 0, "formula"),
        (64 * MIB + 1, 0, 5, 5, 0, "formula"),
        (64 * MIB, 4 * MIB, 6, 6, 4 * MIB, "formula"),  # 64 / (16 - 4) = 5.33
        (64 * MIB, 20 * MIB, 8, 8, 8 * MIB, "formula"),  # broadcast capped at 0.5 x 16 MiB: 64 / 8
        (0, 0, 0, 1, 0, "min-parallelism"),
        (1024 * MIB, 0, 64, 8, 0, "max-parallelism"),
    ],
)
def test_decide_parallelism(
    non_broadcast: int, broadcast: int, formula: int, parallelism: int, counted: int, reason: str
) -> None:
    assert decide_parallelism(non_broadcast, broadcast, OPTIONS) == (formula, parallelism, counted, reason)


# Flink's DefaultVertexParallelismDeciderTest (1.15/1.16, the FLIP-187 formula keyflow
# follows): MIN 3, MAX 100, 1 GiB per task; keyflow does not round to a power of two.
GIB = 1024 * MIB
FLINK = AutoParallelism(min_parallelism=3, max_parallelism=100, avg_data_volume_per_task=GIB)


def test_flink_decide_parallelism() -> None:
    """256 MB broadcast, 8 GB + 256 MB non-broadcast: 8448 MB / (1024 - 256) MB = 11 (Flink 1.15
    normalized it to 8)."""
    assert decide_parallelism(8 * GIB + 256 * MIB, 256 * MIB, FLINK)[:2] == (11, 11)


def test_flink_initially_normalized_parallelism_is_larger_than_max_parallelism() -> None:
    assert decide_parallelism(1024 * GIB + 8 * GIB, 0, FLINK) == (1032, 100, 0, "max-parallelism")


def test_flink_initially_normalized_parallelism_is_smaller_than_min_parallelism() -> None:
    assert decide_parallelism(512 * MIB, 0, FLINK) == (1, 3, 0, "min-parallelism")


def test_flink_non_broadcast_bytes_can_not_divided_evenly() -> None:
    """512 MB broadcast (the cap, 0.5 x 1 GiB) and 8 GB + 256 MB: 8448 / 512 = 16.5 -> 17."""
    assert decide_parallelism(8 * GIB + 256 * MIB, 512 * MIB, FLINK) == (17, 17, 512 * MIB, "formula")


def test_flink_fall_back_to_evenly_distribute_subpartitions() -> None:
    """Flink's even split of 10 subpartitions over 8 subtasks (its fallback; keyflow's
    ``balance=even``)."""
    assert even_ranges(10, 8) == [(0, 0), (1, 1), (2, 2), (3, 4), (5, 5), (6, 6), (7, 7), (8, 9)]


def test_min_parallelism_raises_a_small_stage() -> None:
    options = AutoParallelism(min_parallelism=3, max_parallelism=8, avg_data_volume_per_task=16 * MIB)
    assert decide_parallelism(20 * MIB, 0, options) == (2, 3, 0, "min-parallelism")


def test_even_ranges_are_the_seeds() -> None:
    assert even_ranges(10, 3) == [(0, 2), (3, 5), (6, 9)]
    assert even_ranges(4, 4) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert even_ranges(7, 1) == [(0, 6)]


def test_balanced_ranges_hand_computed() -> None:
    assert balanced_ranges([5, 1, 1, 1, 1, 1], 2) == [(0, 0), (1, 5)]
    assert balanced_ranges([1, 1, 1, 1], 2) == [(0, 1), (2, 3)]
    assert balanced_ranges([0, 3, 0, 0, 3, 0], 2) == [(0, 3), (4, 5)]


def test_an_oversized_subpartition_gets_a_subtask_of_its_own_and_is_reported() -> None:
    decision = decide([10 * MIB, MIB, MIB, MIB, MIB], 0, AutoParallelism(1, 3, 5 * MIB))
    assert decision.parallelism == 3
    assert decision.ranges == ((0, 0), (1, 2), (3, 4))
    assert decision.loads == (10 * MIB, 2 * MIB, 2 * MIB)
    assert decision.oversized == (0,)


def test_never_more_subtasks_than_subpartitions_with_data() -> None:
    decision = decide([0, 32 * MIB, 0, 32 * MIB, 0], 0, OPTIONS)
    assert decision.formula_parallelism == 4
    assert (decision.parallelism, decision.reason) == (2, "non-empty subpartitions")
    assert decision.ranges == ((0, 2), (3, 4))


def test_even_split_when_balancing_is_off() -> None:
    options = AutoParallelism(1, 8, 16 * MIB, balanced=False)
    decision = decide([40 * MIB, 0, 0, 0, 8 * MIB, 0, 0, 0, 16 * MIB], 0, options)
    assert decision.ranges == ((0, 2), (3, 5), (6, 8))
    assert decision.loads == (40 * MIB, 8 * MIB, 16 * MIB)


def test_broadcast_bytes_enter_the_decision() -> None:
    decision = decide([4 * MIB] * 16, 20 * MIB, OPTIONS)
    assert (decision.broadcast_bytes, decision.counted_broadcast_bytes) == (20 * MIB, 8 * MIB)
    assert decision.parallelism == 8


def _best_bottleneck(weights: list[int], parts: int) -> int:
    best = sum(weights)
    for cuts in itertools.combinations(range(1, len(weights)), parts - 1):
        bounds = [0, *cuts, len(weights)]
        best = min(best, max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def test_balanced_ranges_are_optimal_against_a_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        weights = [int(w) for w in rng.integers(0, 20, int(rng.integers(2, 9))) * (rng.random(1) < 0.9)]
        nonempty = sum(1 for w in weights if w)
        if not nonempty:
            continue
        parts = int(rng.integers(1, nonempty + 1))
        ranges = balanced_ranges(weights, parts)
        assert len(ranges) == parts
        assert [first for first, _ in ranges] == [0, *[last + 1 for _, last in ranges[:-1]]]
        assert ranges[-1][1] == len(weights) - 1
        loads = [sum(weights[first : last + 1]) for first, last in ranges]
        assert all(loads), (weights, ranges)
        assert max(loads) == _best_bottleneck(weights, parts), (weights, parts, ranges)


def zipf_loads(subpartitions: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Bytes per subpartition of 20M rows (24 bytes each) over 100k Zipf(1.1) keys hashed to
    subpartitions at random; and each key's subpartition (the hottest key first)."""
    rng = np.random.default_rng(11)
    ranks = np.arange(1, 100_001)
    rows = 20_000_000 * (ranks**-1.1) / (ranks**-1.1).sum()
    where = rng.integers(0, subpartitions, ranks.size)
    return np.bincount(where, weights=rows * 24, minlength=subpartitions).astype(np.int64), where


def test_zipf_at_2_subtasks_is_balanced_within_10_percent() -> None:
    """The hottest key holds 13.5 % of the rows, well below the mean 50 %: max/mean <= 1.1,
    where the seed's even split is far off."""
    loads, _ = zipf_loads()
    decision = decide(loads, 0, AutoParallelism(1, 2, 16 * MIB))
    assert (decision.parallelism, decision.oversized) == (2, ())
    assert decision.max_to_mean <= 1.1
    even = decide(loads, 0, AutoParallelism(1, 2, 16 * MIB, balanced=False))
    assert even.max_to_mean > decision.max_to_mean


@pytest.mark.parametrize("parallelism", [4, 8, 16])
def test_zipf_at_more_subtasks_stays_within_the_contiguous_bound(parallelism: int) -> None:
    """Contiguous ranges cannot beat ``mean + largest subpartition`` in general (the hot key's
    subpartition sits where it sits); balanced ranges stay within it and report a
    subpartition above the mean (from 8 subtasks on, the hottest key's)."""
    loads, where = zipf_loads()
    decision = decide(loads, 0, AutoParallelism(1, parallelism, 16 * MIB))
    mean = loads.sum() / parallelism
    assert max(decision.loads) <= mean + loads.max()
    assert (int(where[0]) in decision.oversized) == (parallelism >= 8)
    assert all(loads[index] > mean for index in decision.oversized)
    assert (
        decision.max_to_mean < decide(loads, 0, AutoParallelism(1, parallelism, 16 * MIB, balanced=False)).max_to_mean
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (lambda: AutoParallelism(min_parallelism=0), r"min-parallelism=0 must be between 1 and max-parallelism=128"),
        (
            lambda: AutoParallelism(min_parallelism=9, max_parallelism=8),
            r"min-parallelism=9 must be between 1 and max-parallelism=8; lower",
        ),
        (lambda: AutoParallelism(avg_data_volume_per_task=0), r"avg-data-volume-per-task=0 must be at least 1"),
        (lambda: AutoParallelism(max_broadcast_ratio=1.0), r"max-broadcast-ratio=1.0 must be in \[0, 1\)"),
    ],
)
def test_invalid_options_are_clear_errors(options: object, message: str) -> None:
    with pytest.raises(KeyflowError, match=message):
        options()  # type: ignore[operator]
