"""Key groups: the fixed buckets of the key space that own all keyed state.

A pipeline has ``K`` key groups (its *max parallelism*). A key's group is a hash of the
key modulo ``K``; an operator running at parallelism ``p`` gives each subtask a
contiguous range of groups. Changing ``p`` only moves range boundaries, so state kept
per key group never has to be re-hashed. Pure math: no Spark here.

>>> assign_to_key_group("hello", 128, hash="flink")
35
>>> key_group_range(128, 10, 4)
(52, 63)
>>> default_max_parallelism(171, policy="flink-legacy")
256
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from keyflow.errors import KeyflowError
from keyflow.hashing.java import java_hash_codes
from keyflow.hashing.keys import KeyColumn, scalar_key_columns, table_key_columns
from keyflow.hashing.murmur3 import hash_int
from keyflow.hashing.spark import spark_hash

HashName = Literal["spark", "flink"]
Policy = Literal["keyflow", "flink-legacy"]

HASHES: tuple[HashName, ...] = ("spark", "flink")
POLICIES: tuple[Policy, ...] = ("keyflow", "flink-legacy")

UPPER_BOUND_MAX_PARALLELISM = 32768
"""No pipeline has more key groups than this (Flink's bound, 2**15)."""

KEY_GROUP_COLUMN = "__keyflow_key_group"
"""The column that carries each row's key group through the keyed exchange and state files."""

FLINK_LOWER_BOUND_MAX_PARALLELISM = 128

KEYFLOW_MAX_PARALLELISM = 27720
"""The keyflow policy's K for parallelism up to :data:`KEYFLOW_RESCALE_RANGE`.

27720 = lcm(1..12): every parallelism 1-12 (and 77 of 1-1024) divides it exactly, and
max/mean key groups per subtask is at most 1.035 at every parallelism 1-1024, so a job
started anywhere in that range stays balanced when it is rescaled anywhere in it.
"""

KEYFLOW_RESCALE_RANGE = 1024


def assign_to_key_group(key: Any, max_parallelism: int, hash: HashName = "spark") -> int:
    """The key group of one key.

    ``hash="spark"`` matches ``pmod(hash(key), K)`` in Spark SQL (a tuple is a composite
    key, hashed like ``hash(k1, k2, ...)``). ``hash="flink"`` matches Flink's
    ``KeyGroupRangeAssignment.assignToKeyGroup``: Python ``int`` hashes as a Java
    ``Long``, ``numpy.int32`` as an ``Integer``, ``str`` as a ``String``.
    """
    return int(_key_groups(scalar_key_columns(key), max_parallelism, hash)[0])


def assign_to_key_groups(values: Any, max_parallelism: int, hash: HashName = "spark") -> npt.NDArray[np.int32]:
    """Key groups of many keys at once, without a Python loop per key.

    ``values`` is a NumPy/Arrow array, a pandas Series or a sequence of keys of one
    type; for a composite key pass a ``pyarrow.Table`` or pandas DataFrame whose columns
    are the key's parts (``hash="spark"`` only). int32 arrays hash as Java ``Integer``,
    int64 arrays as ``Long``.
    """
    return _key_groups(table_key_columns(values), max_parallelism, hash)


def _key_groups(columns: list[KeyColumn], max_parallelism: int, hash: HashName) -> npt.NDArray[np.int32]:
    max_parallelism = check_max_parallelism(max_parallelism)
    if hash == "spark":
        hashes = spark_hash(columns).view(np.int32).astype(np.int64)
        return (hashes % max_parallelism).astype(np.int32)  # NumPy's % is Spark's pmod
    if hash == "flink":
        if len(columns) != 1:
            raise KeyflowError(
                f"hash='flink' takes single-column keys, got {len(columns)} columns; "
                "use hash='spark' for composite keys"
            )
        return _flink_key_groups_for_hash_codes(java_hash_codes(columns[0]), max_parallelism)
    raise KeyflowError(f"unknown hash {hash!r}; choose one of {', '.join(HASHES)}")


def _flink_key_groups_for_hash_codes(hash_codes: npt.NDArray[np.uint32], max_parallelism: int) -> npt.NDArray[np.int32]:
    """Flink's ``computeKeyGroupForKeyHash``: ``MathUtils.murmurHash(code) % K``.

    ``murmurHash`` is one Murmur3 block with seed 0, made non-negative the Java way
    (``Integer.MIN_VALUE`` maps to 0).
    """
    mixed = hash_int(hash_codes, np.zeros_like(hash_codes)).view(np.int32).astype(np.int64)
    non_negative = np.where(mixed == -(2**31), 0, np.abs(mixed))
    return (non_negative % max_parallelism).astype(np.int32)


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> tuple[int, int]:
    """The inclusive range ``(start, end)`` of key groups that ``subtask`` owns."""
    parallelism, max_parallelism = check_parallelism(parallelism, max_parallelism)
    subtask = check_subtask(subtask, parallelism)
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return start, end


def key_group_ranges(max_parallelism: int, parallelism: int) -> list[tuple[int, int]]:
    """Every subtask's inclusive key-group range, in subtask order."""
    return [key_group_range(max_parallelism, parallelism, subtask) for subtask in range(parallelism)]


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask that owns ``key_group`` (the inverse of :func:`key_group_range`)."""
    parallelism, max_parallelism = check_parallelism(parallelism, max_parallelism)
    return check_key_group(key_group, max_parallelism) * parallelism // max_parallelism


def subtasks_for_key_groups(
    max_parallelism: int, parallelism: int, key_groups: npt.NDArray[np.integer]
) -> npt.NDArray[np.int32]:
    """Vectorised :func:`subtask_for_key_group`."""
    parallelism, max_parallelism = check_parallelism(parallelism, max_parallelism)
    groups = np.asarray(key_groups)
    if groups.dtype.kind not in "iu":
        raise KeyflowError(f"key groups must be integers, got an array of {groups.dtype}")
    groups = groups.astype(np.int64)
    out_of_range = (groups < 0) | (groups >= max_parallelism)
    if out_of_range.any():
        first = int(np.argmax(out_of_range))
        raise KeyflowError(
            f"key group {groups[first]} (index {first}) is out of range; valid key groups are 0..{max_parallelism - 1}"
        )
    return (groups * parallelism // max_parallelism).astype(np.int32)


def default_max_parallelism(parallelism: int, policy: Policy = "keyflow") -> int:
    """The number of key groups to use when the pipeline does not set one.

    ``"keyflow"`` (default): :data:`KEYFLOW_MAX_PARALLELISM` up to parallelism 1024;
    above that, the largest multiple of the parallelism not above 32768, so the starting
    parallelism is perfectly balanced. ``"flink-legacy"``: Flink's rule,
    ``roundUpToPowerOfTwo(1.5 * p)`` clamped to [128, 32768], which gives every other
    subtask twice the key groups of its neighbours at many parallelisms (seed 000).
    """
    parallelism, _ = check_parallelism(parallelism, UPPER_BOUND_MAX_PARALLELISM)
    if policy == "keyflow":
        if parallelism <= KEYFLOW_RESCALE_RANGE:
            return KEYFLOW_MAX_PARALLELISM
        return parallelism * (UPPER_BOUND_MAX_PARALLELISM // parallelism)
    if policy == "flink-legacy":
        wanted = 1 << (parallelism + parallelism // 2 - 1).bit_length()
        return min(max(wanted, FLINK_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)
    raise KeyflowError(f"unknown max-parallelism policy {policy!r}; choose one of {', '.join(POLICIES)}")


def explain_default_max_parallelism(parallelism: int, policy: Policy = "keyflow") -> str:
    """One sentence on why :func:`default_max_parallelism` chose its value."""
    chosen = default_max_parallelism(parallelism, policy)
    if policy == "flink-legacy":
        wanted = parallelism + parallelism // 2
        return (
            f"flink-legacy: round 1.5 x {parallelism} = {wanted} up to a power of two, "
            f"clamped to [{FLINK_LOWER_BOUND_MAX_PARALLELISM}, {UPPER_BOUND_MAX_PARALLELISM}] -> {chosen}"
        )
    if parallelism <= KEYFLOW_RESCALE_RANGE:
        return (
            f"keyflow: {chosen} = lcm(1..12) for any parallelism up to {KEYFLOW_RESCALE_RANGE}; "
            f"skew stays <= {worst_rescale_skew(chosen, 1, KEYFLOW_RESCALE_RANGE)[0]:.3f} "
            f"at every parallelism 1..{KEYFLOW_RESCALE_RANGE}"
        )
    return (
        f"keyflow: parallelism {parallelism} > {KEYFLOW_RESCALE_RANGE}, so the largest multiple "
        f"of it <= {UPPER_BOUND_MAX_PARALLELISM}: {parallelism} x {chosen // parallelism} = {chosen}"
    )


def skew(max_parallelism: int, parallelism: int) -> float:
    """Max over mean key groups per subtask: 1.0 is perfectly even, 2.0 is one subtask
    with twice the average load (keys spread evenly over key groups)."""
    parallelism, max_parallelism = check_parallelism(parallelism, max_parallelism)
    return math.ceil(max_parallelism / parallelism) * parallelism / max_parallelism


def worst_rescale_skew(max_parallelism: int, low: int, high: int) -> tuple[float, int]:
    """The largest :func:`skew` over parallelisms ``low..high``, and where it occurs."""
    low, high = _integer(low, "rescale range start"), _integer(high, "rescale range end")
    if not 1 <= low <= high:
        raise KeyflowError(f"rescale range {low}..{high} is empty or not positive; write it as A..B with 1 <= A <= B")
    high, max_parallelism = check_parallelism(high, max_parallelism)
    parallelisms = np.arange(low, high + 1)
    skews = np.ceil(max_parallelism / parallelisms) * parallelisms / max_parallelism
    worst = int(np.argmax(skews))
    return float(skews[worst]), int(parallelisms[worst])


def check_max_parallelism(max_parallelism: int) -> int:
    """Reject a key-group count outside 1..32768; return it as a Python int."""
    max_parallelism = _integer(max_parallelism, "max parallelism")
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise KeyflowError(
            f"max parallelism {max_parallelism} is out of range; it must be between 1 and {UPPER_BOUND_MAX_PARALLELISM}"
        )
    return max_parallelism


def check_parallelism(parallelism: int, max_parallelism: int) -> tuple[int, int]:
    """Reject a parallelism that is not positive or exceeds the key-group count;
    return ``(parallelism, max_parallelism)`` as Python ints."""
    max_parallelism = check_max_parallelism(max_parallelism)
    parallelism = _integer(parallelism, "parallelism")
    if parallelism <= 0:
        raise KeyflowError(f"parallelism {parallelism} must be at least 1")
    if parallelism > max_parallelism:
        fix = f"lower the parallelism to at most {max_parallelism}"
        if max_parallelism < UPPER_BOUND_MAX_PARALLELISM:
            fix += f" or raise the max parallelism (up to {UPPER_BOUND_MAX_PARALLELISM})"
        raise KeyflowError(f"parallelism {parallelism} exceeds max parallelism {max_parallelism}; {fix}")
    return parallelism, max_parallelism


def check_subtask(subtask: int, parallelism: int) -> int:
    """Reject a subtask index outside ``0..parallelism-1``; return it as a Python int."""
    subtask = _integer(subtask, "subtask")
    if not 0 <= subtask < parallelism:
        raise KeyflowError(
            f"subtask {subtask} is out of range; at parallelism {parallelism} subtasks are 0..{parallelism - 1}"
        )
    return subtask


def check_key_group(key_group: int, max_parallelism: int) -> int:
    """Reject a key group outside ``0..K-1``; return it as a Python int."""
    key_group = _integer(key_group, "key group")
    if not 0 <= key_group < max_parallelism:
        raise KeyflowError(f"key group {key_group} is out of range; valid key groups are 0..{max_parallelism - 1}")
    return key_group


def _integer(value: Any, what: str) -> int:
    """NumPy integers become Python ints (no fixed-width overflow); floats and bools are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise KeyflowError(f"{what} must be an integer, got {value!r}")
    return int(value)


def split_key_groups(known: Sequence[int], splits: int, max_parallelism: int) -> list[int]:
    """The key group of each of ``splits`` splits: ``known`` (persisted) kept as they are.

    The first splits are spread evenly over ``[0, K)`` (split ``s`` of ``S`` at the middle of
    the ``s``-th ``K/S`` slice), so every parallelism's contiguous key-group ranges hold an even
    share of splits. A split added later takes the middle of the widest run of key groups no
    split has, so it gets a key group of its own and the spread stays even.
    """
    if splits < len(known):
        raise KeyflowError(
            f"the source has {splits} splits but the checkpoint maps {len(known)} splits to key groups; splits "
            "were removed (the log was recreated?). Restore the missing splits, or start a new checkpoint"
        )
    if splits > max_parallelism:
        raise KeyflowError(
            f"the source has {splits} splits, more than the max parallelism {max_parallelism}: every split of a "
            f"pre-keyed source needs a key group of its own. Set pipeline.max-parallelism to at least {splits} (a "
            "new checkpoint), or use key_by(...), which hashes keys into key groups"
        )
    if not known:
        return [((2 * split + 1) * max_parallelism) // (2 * splits) for split in range(splits)]
    mapping = list(known)
    used = sorted(set(mapping))
    while len(mapping) < splits:
        bounds = [-1, *used, max_parallelism]
        widest = max(range(len(bounds) - 1), key=lambda i: bounds[i + 1] - bounds[i])
        chosen = (bounds[widest] + bounds[widest + 1] + 1) // 2
        mapping.append(chosen)
        used = sorted([*used, chosen])
    return mapping
