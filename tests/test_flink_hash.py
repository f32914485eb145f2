"""Flink hashing is bit-exact: reference values from Apache Flink 2.3, and an
independent one-key-at-a-time oracle for everything else."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyflow.keygroups import assign_to_key_group, assign_to_key_groups
from tests import java_reference as ref

# (key, K=128, K=4096), computed with Apache Flink 2.3's KeyGroupRangeAssignment.
FLINK_REFERENCE = [
    ("hello", 35, 2723),
    ("user-42", 20, 3732),
    ("", 94, 2526),
    (42, 29, 3613),
    (-7, 18, 3218),
    (np.int32(-7), 33, 3489),
    (2**40, 54, 3382),
]


@pytest.mark.parametrize(("key", "k128", "k4096"), FLINK_REFERENCE)
def test_flink_reference_values(key: object, k128: int, k4096: int) -> None:
    assert assign_to_key_group(key, 128, hash="flink") == k128
    assert assign_to_key_group(key, 4096, hash="flink") == k4096


def test_flink_reference_values_vectorised() -> None:
    strings = assign_to_key_groups(["hello", "user-42", ""], 4096, hash="flink")
    longs = assign_to_key_groups(np.array([42, -7, 2**40], dtype=np.int64), 4096, hash="flink")
    ints = assign_to_key_groups(np.array([-7], dtype=np.int32), 4096, hash="flink")
    assert strings.tolist() == [2723, 3732, 2526]
    assert longs.tolist() == [3613, 3218, 3382]
    assert ints.tolist() == [3489]


# Surrogates cannot be encoded; every other code point, BMP or not, must hash right.
unicode_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(unicode_text, min_size=1, max_size=50), st.integers(1, 32768))
def test_flink_strings_match_java_string_hash_code(keys: list[str], max_parallelism: int) -> None:
    expected = [ref.flink_key_group(ref.string_hash_code(key), max_parallelism) for key in keys]
    assert assign_to_key_groups(keys, max_parallelism, hash="flink").tolist() == expected
    sliced = pa.array(["pad", *keys])[1:]  # an Arrow slice has a non-zero buffer offset
    assert assign_to_key_groups(sliced, max_parallelism, hash="flink").tolist() == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50), st.integers(1, 32768))
def test_flink_longs_match_java_long_hash_code(keys: list[int], max_parallelism: int) -> None:
    expected = [ref.flink_key_group(ref.long_hash_code(key), max_parallelism) for key in keys]
    assert assign_to_key_groups(np.array(keys, dtype=np.int64), max_parallelism, hash="flink").tolist() == expected
    assert [assign_to_key_group(key, max_parallelism, hash="flink") for key in keys] == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=50))
def test_flink_int32_hash_as_java_integer(keys: list[int]) -> None:
    expected = [ref.flink_key_group(key, 4096) for key in keys]
    assert assign_to_key_groups(np.array(keys, dtype=np.int32), 4096, hash="flink").tolist() == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=True), min_size=1, max_size=50))
def test_flink_doubles_hash_as_java_double(keys: list[float]) -> None:
    expected = [ref.flink_key_group(ref.double_hash_code(key), 4096) for key in keys]
    assert assign_to_key_groups(np.array(keys, dtype=np.float64), 4096, hash="flink").tolist() == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=50))
def test_flink_float32_hash_as_java_float(keys: list[float]) -> None:
    expected = [ref.flink_key_group(ref.float_hash_code(key), 4096) for key in keys]
    assert assign_to_key_groups(np.array(keys, dtype=np.float32), 4096, hash="flink").tolist() == expected


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16])
def test_flink_small_integers_hash_as_their_value(dtype: type) -> None:
    """Byte/Short/Character.hashCode is the value itself, like Integer's."""
    info = np.iinfo(dtype)
    keys = np.array([info.min, -1 if info.min < 0 else 1, 0, info.max], dtype=dtype)
    expected = [ref.flink_key_group(int(key), 4096) for key in keys]
    assert assign_to_key_groups(keys, 4096, hash="flink").tolist() == expected


def test_every_input_container_gives_the_same_groups() -> None:
    import pandas as pd

    keys = ["hello", "user-42", "", "日本😀"]
    expected = [ref.flink_key_group(ref.string_hash_code(key), 4096) for key in keys]
    containers = [
        keys,
        np.array(keys),
        np.array(keys, dtype=object),
        pd.Series(keys),
        pd.Series(keys, dtype="string"),
        pa.chunked_array([keys[:2], keys[2:]]),
        pa.array(keys).dictionary_encode(),
        pa.array(keys, pa.large_string()),
    ]
    for container in containers:
        assert assign_to_key_groups(container, 4096, hash="flink").tolist() == expected
    longs = np.array([42, -7], dtype=">i8")  # big-endian input is read by value
    assert assign_to_key_groups(longs, 4096, hash="flink").tolist() == [3613, 3218]


def test_flink_booleans_hash_as_java_boolean() -> None:
    expected = [ref.flink_key_group(1231, 128), ref.flink_key_group(1237, 128)]
    assert assign_to_key_groups([True, False], 128, hash="flink").tolist() == expected


# murmurHash is a bijection on 32-bit ints; this is the one code it maps to
# Integer.MIN_VALUE (found by inverting it), which Flink turns into 0, not its negation.
CODE_HASHING_TO_INT_MIN = -2089875627


def test_murmur_result_of_integer_min_value_becomes_zero_like_flink() -> None:
    assert ref.murmur_hash(CODE_HASHING_TO_INT_MIN) == 0
    assert ref.murmur_hash(CODE_HASHING_TO_INT_MIN + 1) != 0
    keys = np.array([CODE_HASHING_TO_INT_MIN, CODE_HASHING_TO_INT_MIN + 1], dtype=np.int32)
    assert assign_to_key_groups(keys, 32768, hash="flink").tolist() == [
        0,
        ref.murmur_hash(CODE_HASHING_TO_INT_MIN + 1) % 32768,
    ]


@pytest.mark.parametrize("hash_name", ["flink", "spark"])
def test_empty_arrays_give_no_key_groups(hash_name: str) -> None:
    for empty in (pa.array([], pa.string()), np.array([], dtype=np.int64), pa.array(["x"])[1:]):
        groups = assign_to_key_groups(empty, 128, hash=hash_name)
        assert groups.dtype == np.int32
        assert len(groups) == 0
