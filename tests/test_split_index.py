"""The check that a pre-keyed source's key stays in one split (``keyflow.state.splits``), pure:
reports as subtasks write them, answers from plain Python over every key's history."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.state.splits import PREVIOUS_KEY_GROUP, SplitIndex

MAPPING = [5, 20, 40, 60]  # split -> key group


def report(rows: list[tuple[str, int, int | None]]) -> pa.Table:
    """(key, key group, key group the subtask already had the key under, or None)."""
    keys, groups, previous = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table(
        {
            "user": pa.array(keys, pa.string()),
            KEY_GROUP_COLUMN: pa.array(groups, pa.int32()),
            PREVIOUS_KEY_GROUP: pa.array(previous, pa.int32()),
        }
    )


def test_a_key_reported_many_times_counts_once() -> None:
    """Rows of one key from two splits in one call are reported row by row; the count is keys."""
    index = SplitIndex(["user"])
    rows = [("a", 5, None), ("a", 20, 5), ("a", 20, 5), ("a", 20, 5), ("b", 40, None), ("b", 60, None)]
    count, examples, new = index.check(report(rows), MAPPING)
    assert count == 2
    assert sorted((c.key["user"], sorted(c.splits)) for c in examples) == [("a", [0, 1]), ("b", [2, 3])]
    assert sorted(new.to_pylist(), key=lambda r: r["user"]) == [
        {"user": "a", KEY_GROUP_COLUMN: 5},
        {"user": "b", KEY_GROUP_COLUMN: 40},
    ]


def test_a_key_back_in_another_split_in_a_later_batch_is_caught() -> None:
    index = SplitIndex(["user"])
    _, _, new = index.check(report([("a", 5, None), ("b", 20, None)]), MAPPING)
    index.add(new)
    count, examples, new = index.check(report([("a", 60, None), ("c", 40, None)]), MAPPING)
    assert count == 1
    assert [(c.key, c.splits) for c in examples] == [({"user": "a"}, (0, 3))]
    assert new.column("user").to_pylist() == ["c"]


def test_an_unmapped_key_group_is_described_not_a_crash() -> None:
    index = SplitIndex(["user"])
    count, examples, _ = index.check(report([("a", 5, None), ("a", 7, None)]), MAPPING)
    assert count == 1
    assert examples[0].describe() == "key {'user': 'a'} in splits 0 and ?"


def test_random_reports_against_every_keys_history() -> None:
    """Micro-batches of random rows over two subtasks (splits 0-1 and 2-3), mostly in each
    key's home split: each batch's count is the number of reported keys seen in more than one
    key group (in this batch's reports, or first seen in an earlier batch)."""
    rng = np.random.default_rng(7)
    index = SplitIndex(["user"])
    first_group: dict[str, int] = {}  # what the index must remember
    in_state: dict[tuple[int, str], int] = {}  # what each subtask's state remembers
    conflicts = 0
    for _ in range(40):
        rows: list[tuple[str, int, int | None]] = []
        for _ in range(int(rng.integers(0, 60))):
            number = int(rng.integers(0, 80))
            split = number % 4 if rng.random() < 0.9 else int(rng.integers(0, 4))
            user, group, subtask = f"u{number}", MAPPING[split], split // 2
            known = in_state.get((subtask, user))
            if known != group:  # what a subtask reports: a key new to it, or under another key group
                rows.append((user, group, known))
                in_state.setdefault((subtask, user), group)
        seen: dict[str, set[int]] = {}
        for user, group, known in rows:
            seen.setdefault(user, {first_group[user]} if user in first_group else set()).add(group)
            if known is not None:
                seen[user].add(known)
        count, _, new = index.check(report(rows), MAPPING)
        assert count == sum(1 for groups in seen.values() if len(groups) > 1)
        conflicts += count
        index.add(new)
        for user in {user for user, _, known in rows if known is None} - set(first_group):
            first_group[user] = min(group for u, group, known in rows if u == user and known is None)
        assert index.table is not None
        users, groups = index.table.column("user").to_pylist(), index.table.column(KEY_GROUP_COLUMN).to_pylist()
        assert dict(zip(users, groups, strict=True)) == first_group
    assert conflicts > 10  # the random rows do put keys in two splits
