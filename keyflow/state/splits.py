"""Pre-keyed sources: the check that a key stays in one split. Pure: no Spark.

A pre-keyed source's keys live in the key group of their split (see
``keyflow.keygroups.split_key_groups``); a key in two splits would have two states, one per
split, which the external partitioner promised never to happen. This checks the promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from keyflow.keygroups import KEY_GROUP_COLUMN

PREVIOUS_KEY_GROUP = "__keyflow_previous_key_group"
"""In a subtask's report of keys: the key group the key already had state in (null: new key)."""


@dataclass(frozen=True)
class Conflict:
    """A key seen in two splits."""

    key: dict[str, object]
    splits: tuple[int, int]

    def describe(self) -> str:
        return f"key {self.key} in splits {self.splits[0]} and {self.splits[1]}"


class SplitIndex:
    """The key group (split) every key of a pre-keyed operator was first seen in.

    Subtasks report the keys new to their state with their key group (and, for a key that
    already had state in the subtask under another key group, that one); :meth:`check` finds
    a key that is in two splits, also when the splits are read by different subtasks or in
    different micro-batches. Only new keys are reported, so a steady stream costs nothing.
    """

    def __init__(self, keys: Sequence[str], table: pa.Table | None = None) -> None:
        self.keys = tuple(keys)
        self.table = table

    def check(self, reported: pa.Table, mapping: Sequence[int]) -> tuple[int, list[Conflict], pa.Table]:
        """Among ``reported`` keys and against the index: the number of keys in two splits, a
        few of them as examples, and the keys to add to the index (each once, first key group)."""
        split_of = {key_group: split for split, key_group in enumerate(mapping)}
        keys = list(self.keys)
        count, examples = 0, []

        def found(clashes: pa.Table, before: str, after: str) -> None:
            nonlocal count
            count += clashes.num_rows
            for row in clashes.slice(0, 5).to_pylist():
                pair = (split_of[row[before]], split_of[row[after]])
                examples.append(Conflict({key: row[key] for key in keys}, pair))

        previous, key_group = reported[PREVIOUS_KEY_GROUP], reported[KEY_GROUP_COLUMN]
        found(reported.filter(pc.and_(pc.is_valid(previous), pc.not_equal(previous, key_group))),
              PREVIOUS_KEY_GROUP, KEY_GROUP_COLUMN)  # fmt: skip
        new = reported.filter(pc.is_null(previous)).select([*keys, KEY_GROUP_COLUMN])
        grouped = new.group_by(keys, use_threads=False).aggregate(
            [(KEY_GROUP_COLUMN, "min"), (KEY_GROUP_COLUMN, "max")]
        )
        lowest, highest = f"{KEY_GROUP_COLUMN}_min", f"{KEY_GROUP_COLUMN}_max"
        found(grouped.filter(pc.not_equal(grouped[lowest], grouped[highest])), lowest, highest)
        first_seen = grouped.select(keys).append_column(KEY_GROUP_COLUMN, grouped[lowest].cast(pa.int32()))
        if self.table is not None and self.table.num_rows:
            known = self.table.rename_columns([*keys, PREVIOUS_KEY_GROUP])
            joined = first_seen.join(known, keys, join_type="inner", use_threads=False)
            found(joined.filter(pc.not_equal(joined[PREVIOUS_KEY_GROUP], joined[KEY_GROUP_COLUMN])),
                  PREVIOUS_KEY_GROUP, KEY_GROUP_COLUMN)  # fmt: skip
            first_seen = first_seen.join(self.table.select(keys), keys, join_type="left anti", use_threads=False)
        return count, examples, first_seen

    def add(self, keys: pa.Table) -> None:
        if keys.num_rows:
            self.table = keys if self.table is None else pa.concat_tables([self.table, keys.cast(self.table.schema)])
