"""Every bad input to the key-group API gets a ValueError naming the value and the fix."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from keyflow import keygroups as kg


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: kg.key_group_range(128, 0, 0), "parallelism 0 must be at least 1"),
        (lambda: kg.key_group_range(128, -3, 0), "parallelism -3 must be at least 1"),
        (lambda: kg.skew(128, 200), "parallelism 200 exceeds max parallelism 128; lower the parallelism"),
        (
            lambda: kg.key_group_range(40000, 4, 0),
            "max parallelism 40000 is out of range; it must be between 1 and 32768",
        ),
        (lambda: kg.assign_to_key_group("a", 0), "max parallelism 0 is out of range"),
        (lambda: kg.assign_to_key_group("a", 32769), "max parallelism 32769 is out of range"),
        (lambda: kg.key_group_range(128, 10, 10), "subtask 10 is out of range; at parallelism 10 subtasks are 0..9"),
        (lambda: kg.key_group_range(128, 10, -1), "subtask -1 is out of range"),
        (lambda: kg.subtask_for_key_group(128, 4, 128), "key group 128 is out of range; valid key groups are 0..127"),
        (lambda: kg.default_max_parallelism(0), "parallelism 0 must be at least 1"),
        (lambda: kg.default_max_parallelism(40000), "parallelism 40000 exceeds max parallelism 32768"),
        (lambda: kg.default_max_parallelism(4, policy="fast"), "unknown max-parallelism policy 'fast'; choose one of"),
        (lambda: kg.assign_to_key_group("a", 128, hash="md5"), "unknown hash 'md5'; choose one of spark, flink"),
        (lambda: kg.skew(128, 2.5), "parallelism must be an integer, got 2.5"),
        (lambda: kg.skew(True, 1), "max parallelism must be an integer, got True"),
        (lambda: kg.worst_rescale_skew(128, 5, 2), "rescale range 5..2 is empty"),
        (lambda: kg.worst_rescale_skew(128, 1.5, 3), "rescale range start must be an integer, got 1.5"),
        (lambda: kg.key_group_range(128, 10, 1.5), "subtask must be an integer, got 1.5"),
        (lambda: kg.subtask_for_key_group(128, 10, 63.5), "key group must be an integer, got 63.5"),
        (lambda: kg.subtask_for_key_group(128, 10, None), "key group must be an integer, got None"),
        (
            lambda: kg.skew(32768, 40000),
            "parallelism 40000 exceeds max parallelism 32768; lower the parallelism to at most 32768",
        ),
        (
            lambda: kg.subtasks_for_key_groups(128, 10, np.array([5, -1, 200])),
            "key group -1 (index 1) is out of range; valid key groups are 0..127",
        ),
        (
            lambda: kg.subtasks_for_key_groups(128, 10, np.array([1.5])),
            "key groups must be integers, got an array of float64",
        ),
    ],
)
def test_math_errors(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()  # type: ignore[operator]


def test_none_key() -> None:
    with pytest.raises(ValueError, match="key is None; keys must not be null"):
        kg.assign_to_key_group(None, 128)


def test_null_keys_in_an_array_report_count_and_first_index() -> None:
    with pytest.raises(ValueError, match=r"2 of 4 keys are null \(first at index 1\).*filter the nulls out"):
        kg.assign_to_key_groups(["a", None, "b", None], 128)
    with pytest.raises(ValueError, match=r"1 of 3 keys are null \(first at index 2\)"):
        kg.assign_to_key_groups(pa.array([1.0, 2.0, None]), 128, hash="flink")


@pytest.mark.parametrize("key", [b"bytes", [1, 2], {"a": 1}, object(), 3 + 4j])
def test_unsupported_scalar_key_types(key: object) -> None:
    with pytest.raises(ValueError, match=rf"unsupported key type {type(key).__name__} .*supported: str, int"):
        kg.assign_to_key_group(key, 128)


def test_unsupported_array_type_names_the_type_and_the_cast() -> None:
    with pytest.raises(ValueError, match=r"unsupported key type uint64; .*cast the key"):
        kg.assign_to_key_groups(np.array([1, 2], dtype=np.uint64), 128)
    with pytest.raises(ValueError, match=r"unsupported key type binary"):
        kg.assign_to_key_groups(pa.array([b"x"]), 128)


def test_mixed_types_in_one_array() -> None:
    with pytest.raises(ValueError, match="keys in one array must share one supported type"):
        kg.assign_to_key_groups([1, "a"], 128)


def test_int_outside_long_range() -> None:
    with pytest.raises(ValueError, match=r"int key 9223372036854775808 is outside the 64-bit range"):
        kg.assign_to_key_group(2**63, 128)


def test_a_string_is_not_an_array_of_keys() -> None:
    with pytest.raises(ValueError, match="keys must be an array or a sequence of keys, got str"):
        kg.assign_to_key_groups("abc", 128)


def test_flink_hash_rejects_composite_keys() -> None:
    with pytest.raises(ValueError, match="hash='flink' takes single-column keys, got 2 columns; use hash='spark'"):
        kg.assign_to_key_group(("a", 1), 128, hash="flink")


def test_empty_composite_key() -> None:
    with pytest.raises(ValueError, match=r"a composite key needs at least one element"):
        kg.assign_to_key_group((), 128)


def test_no_fix_is_offered_that_cannot_work() -> None:
    with pytest.raises(ValueError, match=r"at most 32768$"):
        kg.skew(32768, 40000)


def test_mixed_ints_and_floats_are_refused_not_widened() -> None:
    """Arrow would silently make [42, 2.5] doubles, and 42 would land in another key group."""
    with pytest.raises(ValueError, match="got both int and float; an int key hashes as a Long"):
        kg.assign_to_key_groups([42, 2.5], 128, hash="flink")
    with pytest.raises(ValueError, match="got both int and float"):
        kg.assign_to_key_groups(np.array([1, 2.5], dtype=object), 128)


def test_ints_beyond_64_bits_in_a_list() -> None:
    with pytest.raises(ValueError, match="an int key is outside the 64-bit range"):
        kg.assign_to_key_groups([1, 2**63], 128)


def test_arrays_must_be_one_dimensional() -> None:
    with pytest.raises(ValueError, match=r"keys must be a 1-dimensional array, got shape \(2, 2\)"):
        kg.assign_to_key_groups(np.zeros((2, 2), dtype=np.int64), 128)


def test_composite_key_table_without_columns() -> None:
    with pytest.raises(ValueError, match="a composite key table has no columns"):
        kg.assign_to_key_groups(pa.table({}), 128)
