"""Key-group ranges, the default max-parallelism policies and skew, checked against
brute-force counts rather than the formulas under test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyflow import keygroups as kg


def counts_per_subtask(max_parallelism: int, parallelism: int) -> np.ndarray:
    """Key groups per subtask by asking which subtask owns each key group."""
    owners = [kg.subtask_for_key_group(max_parallelism, parallelism, group) for group in range(max_parallelism)]
    return np.bincount(owners, minlength=parallelism)


def brute_force_skew(max_parallelism: int, parallelism: int) -> float:
    counts = np.array([end - start + 1 for start, end in kg.key_group_ranges(max_parallelism, parallelism)])
    return float(counts.max() / counts.mean())


def test_flink_reference_ranges() -> None:
    assert kg.key_group_range(128, 10, 4) == (52, 63)
    assert kg.key_group_range(4096, 3, 1) == (1366, 2730)


@st.composite
def k_and_p(draw: st.DrawFn, max_k: int = 32768) -> tuple[int, int]:
    max_parallelism = draw(st.integers(1, max_k))
    return max_parallelism, draw(st.integers(1, max_parallelism))


@settings(max_examples=300, deadline=None)
@given(k_and_p())
def test_ranges_are_contiguous_disjoint_and_cover_all_groups(case: tuple[int, int]) -> None:
    max_parallelism, parallelism = case
    ranges = kg.key_group_ranges(max_parallelism, parallelism)
    assert ranges[0][0] == 0
    assert ranges[-1][1] == max_parallelism - 1
    for (_, end), (next_start, _) in itertools.pairwise(ranges):
        assert next_start == end + 1
    sizes = [end - start + 1 for start, end in ranges]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1
    # Flink's computeKeyGroupRangeForOperatorIndex, in exact integer arithmetic.
    starts = [-(-subtask * max_parallelism // parallelism) for subtask in range(parallelism)]
    assert [start for start, _ in ranges] == starts


@settings(max_examples=150, deadline=None)
@given(k_and_p(max_k=4096))
def test_subtask_for_key_group_inverts_ranges(case: tuple[int, int]) -> None:
    max_parallelism, parallelism = case
    owners = np.empty(max_parallelism, dtype=np.int64)
    for subtask, (start, end) in enumerate(kg.key_group_ranges(max_parallelism, parallelism)):
        owners[start : end + 1] = subtask
    groups = np.arange(max_parallelism)
    assert [kg.subtask_for_key_group(max_parallelism, parallelism, g) for g in groups] == owners.tolist()
    np.testing.assert_array_equal(kg.subtasks_for_key_groups(max_parallelism, parallelism, groups), owners)


@settings(max_examples=150, deadline=None)
@given(k_and_p(max_k=4096))
def test_skew_is_max_over_mean(case: tuple[int, int]) -> None:
    max_parallelism, parallelism = case
    assert kg.skew(max_parallelism, parallelism) == pytest.approx(brute_force_skew(max_parallelism, parallelism))


def flink_rule(parallelism: int) -> int:
    """Flink's KeyGroupRangeAssignment.computeDefaultMaxParallelism, written out with a loop."""
    target, power = parallelism + parallelism // 2, 1
    while power < target:
        power *= 2
    return min(max(power, 128), 32768)


@pytest.mark.parametrize(
    ("parallelism", "expected"), [(1, 128), (85, 128), (86, 256), (171, 256), (1000, 2048), (30000, 32768)]
)
def test_flink_legacy_reference_values(parallelism: int, expected: int) -> None:
    assert kg.default_max_parallelism(parallelism, policy="flink-legacy") == expected


def test_flink_legacy_matches_flink_rule_everywhere() -> None:
    for parallelism in range(1, 32769):
        assert kg.default_max_parallelism(parallelism, policy="flink-legacy") == flink_rule(parallelism)


def test_keyflow_policy_stays_balanced_at_start_and_after_any_rescale() -> None:
    """Seed 000's target: for any start in 1..1024, skew <= 1.05 there and at every 1..1024."""
    for start in range(1, 1025):
        max_parallelism = kg.default_max_parallelism(start)
        assert max_parallelism <= 32768
        assert brute_force_skew(max_parallelism, start) <= 1.05
    for max_parallelism in {kg.default_max_parallelism(start) for start in range(1, 1025)}:
        worst = max(brute_force_skew(max_parallelism, q) for q in range(1, 1025))
        assert worst <= 1.05


def test_flink_legacy_is_the_skew_seed_000_describes() -> None:
    at_own = max(brute_force_skew(flink_rule(p), p) for p in range(1, 1025))
    after_rescale = max(
        brute_force_skew(k, q) for k in {flink_rule(p) for p in range(1, 1025)} for q in range(1, min(k, 1024) + 1)
    )
    # The issue quotes 1.33 at Flink's own parallelism; brute force finds worse: p=1023
    # gets K=2048, so some subtasks hold 3 key groups against a mean of 2.002 (1.499).
    assert at_own == pytest.approx(3 * 1023 / 2048)
    assert after_rescale > 1.95


def test_keyflow_policy_above_1024_balances_the_starting_parallelism() -> None:
    for start in (1025, 2000, 4096, 10_000, 16_385, 32_768):
        max_parallelism = kg.default_max_parallelism(start)
        assert start <= max_parallelism <= 32768
        assert max_parallelism % start == 0
        assert kg.skew(max_parallelism, start) == 1.0


def test_worst_rescale_skew_is_the_brute_force_maximum() -> None:
    skews = {q: brute_force_skew(256, q) for q in range(100, 201)}
    worst_at = max(skews, key=lambda q: (skews[q], -q))
    assert kg.worst_rescale_skew(256, 100, 200) == (pytest.approx(skews[worst_at]), worst_at)


def test_numpy_integers_are_plain_integers() -> None:
    """Fixed-width NumPy ints must not overflow inside the range arithmetic."""
    assert kg.key_group_range(np.int16(32000), np.int16(3000), np.int16(2999)) == kg.key_group_range(32000, 3000, 2999)
    assert kg.subtask_for_key_group(np.int16(32000), np.int16(3000), np.int16(31999)) == 2999
    assert kg.default_max_parallelism(np.int64(171), "flink-legacy") == 256
    assert kg.default_max_parallelism(np.int16(2000)) == 32000


def test_explanations_name_the_rule() -> None:
    assert "27720 = lcm(1..12)" in kg.explain_default_max_parallelism(171)
    assert "1.5 x 171 = 256" in kg.explain_default_max_parallelism(171, "flink-legacy")
    assert "2000 x 16 = 32000" in kg.explain_default_max_parallelism(2000)
