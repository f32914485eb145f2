"""Pre-keyed sources: the check that a key stays in one split. Pure: no Spark.

A pre-keyed source's keys live in the key group of their split (see
``keyflow.keygroups.split_key_groups``); a key in two splits would have two states, one per
split, which the external partitioner promised never to happen. This checks the promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.state.key_index import KeyTable

PREVIOUS_KEY_GROUP = "__keyflow_previous_key_group"
"""In a subtask's report of keys: the key group the key already had state in (null: new key)."""


@dataclass(frozen=True)
class Conflict:
    """A key seen in two splits."""

    key: dict[str, object]
    splits: tuple[int | None, int | None]  # None: a key group no split maps to (an edited checkpoint)

    def describe(self) -> str:
        first, second = ("?" if split is None else split for split in self.splits)
        return f"key {self.key} in splits {first} and {second}"


class SplitIndex:
    """The key group (split) every key of a pre-keyed operator was first seen in.

    Subtasks report the keys new to their state with their key group (and, for a key that
    already had state in the subtask under another key group, that one); :meth:`check` finds
    a key that is in two splits, also when the splits are read by different subtasks or in
    different micro-batches. Only new keys are reported and probed (in a hash index that grows
    by chunks, see :class:`KeyTable`), so a steady stream costs little however many keys it has.
    """

    def __init__(self, keys: Sequence[str], table: pa.Table | None = None) -> None:
        self.keys = tuple(keys)
        self.table: pa.Table | None = None  # every indexed key with its first key group, in order added
        self._index = KeyTable()
        self._key_groups = np.empty(0, dtype=np.int32)
        if table is not None:
            self.add(table)

    def check(self, reported: pa.Table, mapping: Sequence[int]) -> tuple[int, list[Conflict], pa.Table]:
        """Among ``reported`` keys and against the index: the number of distinct keys in two
        splits, a few of them as examples, and the keys to add to the index (each once, with
        the first key group it was seen in)."""
        keys = list(self.keys)
        previous, key_group = reported[PREVIOUS_KEY_GROUP], reported[KEY_GROUP_COLUMN]
        moved = reported.filter(pc.and_(pc.is_valid(previous), pc.not_equal(previous, key_group)))
        clashes = [_pairs(moved.select(keys), moved[PREVIOUS_KEY_GROUP], moved[KEY_GROUP_COLUMN])]
        new = reported.filter(pc.is_null(previous)).select([*keys, KEY_GROUP_COLUMN])
        grouped = new.group_by(keys, use_threads=False).aggregate(
            [(KEY_GROUP_COLUMN, "min"), (KEY_GROUP_COLUMN, "max")]
        )
        lowest, highest = grouped[f"{KEY_GROUP_COLUMN}_min"], grouped[f"{KEY_GROUP_COLUMN}_max"]
        split = grouped.filter(pc.not_equal(lowest, highest))
        clashes.append(_pairs(split.select(keys), split[f"{KEY_GROUP_COLUMN}_min"], split[f"{KEY_GROUP_COLUMN}_max"]))
        first_seen = grouped.select(keys).append_column(KEY_GROUP_COLUMN, lowest.cast(pa.int32()))
        slots = self._index.lookup(first_seen.select(keys))
        known = slots >= 0
        before = self._key_groups[slots[known]]
        seen = first_seen.filter(pa.array(known))
        differ = before != seen[KEY_GROUP_COLUMN].to_numpy()
        clashes.append(
            _pairs(
                seen.select(keys).filter(pa.array(differ)),
                before[differ],
                seen[KEY_GROUP_COLUMN].filter(pa.array(differ)),
            )
        )
        distinct = (
            pa.concat_tables(clashes, promote_options="permissive")
            .group_by(keys, use_threads=False)
            .aggregate([("first", "first"), ("second", "first")])
        )
        split_of = {group: split for split, group in enumerate(mapping)}
        examples = [
            Conflict(
                {key: row[key] for key in keys}, (split_of.get(row["first_first"]), split_of.get(row["second_first"]))
            )
            for row in distinct.slice(0, 3).to_pylist()
        ]
        return distinct.num_rows, examples, first_seen.filter(pa.array(~known))

    def add(self, keys: pa.Table) -> None:
        """Index ``keys`` (new ones, as :meth:`check` returns them)."""
        if not keys.num_rows:
            return
        self._index.add(keys.select(list(self.keys)))
        groups = keys[KEY_GROUP_COLUMN].to_numpy().astype(np.int32)
        self._key_groups = np.concatenate([self._key_groups, groups])
        self.table = keys if self.table is None else pa.concat_tables([self.table, keys.cast(self.table.schema)])


def _pairs(keys: pa.Table, first: Any, second: Any) -> pa.Table:
    """Keys with the two key groups each was seen in."""
    return keys.append_column("first", pa.array(first, pa.int32())).append_column(
        "second", pa.array(second, pa.int32())
    )
