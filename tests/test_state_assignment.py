"""The pure pieces behind a restore, without Spark: state assignment, the plan file,
state directories, schema checks and key boundaries. Expected answers are worked out in
plain Python next to each case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from keyflow import Pipeline, console, datagen, sequence
from keyflow.errors import CheckpointError, KeyflowError, PlanError
from keyflow.keygroups import key_group_range
from keyflow.schemas import ColumnsDifferError, TypesDifferError, conform_to
from keyflow.state.assignment import StateFile, compacting_subtasks, delta_depth, files_to_read, needed_files
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.keyed import key_boundaries
from keyflow.state.plan_file import PlanFile, read_plan_file, write_plan_file
from keyflow.state.state_files import operator_dir

K = 12


def state_file(kind: str, version: int, first: int, last: int) -> StateFile:
    return StateFile(f"v{version}/{kind}-{first}-{last}", kind, version, first, last, 1, 1, 1)


# Written at parallelism 2 (ranges 0..5, 6..11), then 3 (0..3, 4..7, 8..11).
HISTORY = [
    state_file("delta", 0, 0, 5),
    state_file("delta", 0, 6, 11),
    state_file("full", 1, 0, 5),
    state_file("delta", 1, 6, 11),
    state_file("delta", 2, 0, 3),
    state_file("delta", 2, 4, 7),
    state_file("delta", 2, 8, 11),
]


def test_files_to_read_for_a_range_written_at_other_parallelisms() -> None:
    assert files_to_read(HISTORY, 4, 7) == [HISTORY[0], HISTORY[1], HISTORY[2], HISTORY[3], HISTORY[5]]
    assert files_to_read(HISTORY, 4, 7, after_version=1) == [HISTORY[5]]
    assert files_to_read(HISTORY, 0, 0) == [HISTORY[0], HISTORY[2], HISTORY[4]]
    full_first = [state_file("delta", 3, 0, 11), state_file("full", 3, 0, 11)]
    assert [f.kind for f in files_to_read(full_first, 0, 11)] == ["full", "delta"]


def test_needed_files_drop_what_a_newer_full_file_supersedes() -> None:
    # key groups 0..5: the full file of version 1 replaces the delta of version 0
    assert HISTORY[0] not in needed_files(HISTORY, K)
    assert set(needed_files(HISTORY, K)) == set(HISTORY) - {HISTORY[0]}


def test_delta_depth_and_compaction_choice() -> None:
    depth = delta_depth(HISTORY, K)
    # 0..3: v2 delta after v1 full = 1; 4..5: v2 delta after full = 1; 6..7: v0, v1, v2 = 3; 8..11: 3
    assert depth.tolist() == [1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3]
    assert compacting_subtasks(HISTORY, K, 3, max_deltas=3) == frozenset({1, 2})  # ranges 4..7 and 8..11
    assert compacting_subtasks(HISTORY, K, 2, max_deltas=3) == frozenset({1})  # 6..11
    assert compacting_subtasks(HISTORY, K, 2, max_deltas=4) == frozenset()
    for subtask in compacting_subtasks(HISTORY, K, 3, max_deltas=3):
        first, last = key_group_range(K, 3, subtask)
        assert depth[first : last + 1].max() >= 3


def test_plan_file_round_trip_and_damage(tmp_path: Path) -> None:
    p = Pipeline(parallelism=2)
    p.source(datagen(rows=5, fields={"k": sequence()})).key_by("k").aggregate(n="count(*)").sink(console())
    checkpoint = Checkpoint(str(tmp_path))
    assert read_plan_file(checkpoint) is None
    written = PlanFile("id-1", p.plan(), "k bigint", {"aggregate[k]": {"k": "bigint"}})
    write_plan_file(checkpoint, written)
    assert read_plan_file(checkpoint) == written
    (tmp_path / "plan.json").write_text('{"checkpoint_id": "id-1", "plan": {"format_version": 2')
    with pytest.raises(CheckpointError, match=r"damaged checkpoint file plan.json is torn: not complete JSON"):
        read_plan_file(checkpoint)
    (tmp_path / "plan.json").write_text('{"checkpoint_id": "x", "plan": {"format_version": 1}}')
    with pytest.raises(PlanError, match="plan format_version 1 is not supported"):
        read_plan_file(checkpoint)


def test_operator_dirs_are_path_safe_and_distinct() -> None:
    assert operator_dir("running_total") == "op-running_total"
    hashed = [operator_dir(uid) for uid in ("per_user[user]", "Totals", "totals", "a:b", "a_b")]
    assert hashed[4] == "op-a_b"
    assert all(name.startswith("op-") for name in hashed)
    assert len({name.lower() for name in hashed}) == len(hashed)  # no two share a directory, in any case
    assert all(set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.-") for name in hashed)


def test_conform_to_a_schema() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    table = pa.table({"b": ["x"], "a": pa.array([1], pa.int32())})
    assert conform_to(table, schema).schema == schema
    with pytest.raises(ColumnsDifferError, match=r"columns \['b'\] are not \['a', 'b'\]"):
        conform_to(table.select(["b"]), schema)
    with pytest.raises(TypesDifferError):
        conform_to(pa.table({"a": ["not a number"], "b": ["x"]}), schema)


def test_key_boundaries_of_rows_grouped_by_key() -> None:
    data = pa.table({"k": ["a", "a", "b", "b", "b", "a"], "n": [1, 1, 1, 2, 2, 2], "f": [np.nan] * 6})
    assert key_boundaries(data, ("k",)).tolist() == [True, False, True, False, False, True]
    assert key_boundaries(data, ("k", "n")).tolist() == [True, False, True, True, False, True]
    assert key_boundaries(data, ("f",)).tolist() == [True, False, False, False, False, False]  # NaN is one key
    assert key_boundaries(data.slice(0, 0), ("k",)).tolist() == []


def test_keyflow_errors_are_value_errors() -> None:
    """Existing callers that catch ValueError keep working; the CLI catches KeyflowError."""
    assert issubclass(KeyflowError, ValueError)
    assert issubclass(CheckpointError, KeyflowError)
