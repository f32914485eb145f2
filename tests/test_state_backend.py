"""The checkpoint state backend without Spark: files, manifests, restore of any key-group range.

A plain-Python dict model of "what each key holds after each version" is the expected answer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyflow import ValueState
from keyflow.errors import CheckpointError, DamagedFileError
from keyflow.keygroups import KEY_GROUP_COLUMN, assign_to_key_groups, key_group_range
from keyflow.state.assignment import StateFile, delta_depth, needed_files
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.durable import CheckpointedState
from keyflow.state.integrity import retain, retain_known, verify
from keyflow.state.key_index import KeyIndex, KeyTable, PairCodes
from keyflow.state.manifests import Manifest
from keyflow.state.memory import KeyedStateStore
from keyflow.state.state_files import PART_ROWS, read_part, restore, write_state_file
from tests.filesystems import CountingFiles

K = 64
STATE = {"total": ValueState("int64")}


class Collected:
    """The subtasks' reports of files written, as the runtime's accumulator collects them."""

    def __init__(self, into: list[StateFile]) -> None:
        self.into = into

    def add(self, term: list[StateFile]) -> None:
        self.into.extend(term)


def new_checkpoint(path: Path) -> Checkpoint:
    checkpoint = Checkpoint(str(path))
    checkpoint.write_atomically("plan.json", b"{}")  # a streaming job writes it first; workers check they see it
    return checkpoint


def write_version(checkpoint: Checkpoint, version: int, parallelism: int, updates: dict[str, int | None],
                  previous: Manifest | None, compact: frozenset[int] = frozenset(), run: str = "run",
                  commit: bool = True) -> Manifest:  # fmt: skip
    """What the runtime does for one micro-batch: every subtask opens its range, applies the
    updates of its keys, closes (writing a delta or full file); then the manifest commits."""
    files = tuple(previous.operators["1"]) if previous else ()
    base = previous.version if previous else -1
    written: list[StateFile] = []
    backend = CheckpointedState(checkpoint.uri, checkpoint.root, run, "1", base, version, files, compact, K,
                                Collected(written))  # fmt: skip
    keys = np.array(list(updates), dtype=object)
    groups = assign_to_key_groups(pa.array(keys, pa.string()), K) if len(keys) else np.zeros(0, np.int32)
    for subtask in range(parallelism):
        first, last = key_group_range(K, parallelism, subtask)
        store = backend.open(STATE, subtask, first, last)
        mine = (groups >= first) & (groups <= last)
        if mine.any():
            slots = store.slots(pa.table({"user": pa.array(keys[mine], pa.string())}), groups[mine].astype(np.int32))
            store.columns["total"].set(slots, pa.array([updates[k] for k in keys[mine]], pa.int64()))
        backend.close(store, subtask, first, last)
    new = checkpoint.state_files.newest(written)
    manifest = Manifest(version, parallelism, K, {"1": needed_files([*files, *new], K)})
    if commit:
        checkpoint.manifests.commit(manifest)
    return manifest


def restored(checkpoint: Checkpoint, manifest: Manifest, first: int, last: int) -> dict[str, int]:
    store = KeyedStateStore(STATE)
    restore(checkpoint, manifest.operators["1"], first, last, store, K)
    table = store.to_table(store.all_slots())
    if table.num_rows == 0:
        return {}  # a store that never saw a key has no key columns yet
    return {u: t for u, t in zip(table.column("user").to_pylist(), table.column("total").to_pylist(), strict=True)
            if t is not None}  # fmt: skip


def in_range(model: dict[str, int | None], first: int, last: int) -> dict[str, int]:
    keys = list(model)
    groups = assign_to_key_groups(pa.array(keys, pa.string()), K)
    return {k: model[k] for k, g in zip(keys, groups, strict=True) if first <= g <= last and model[k] is not None}


@settings(max_examples=15, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 6),  # parallelism of the version
            st.dictionaries(st.sampled_from([f"u{i}" for i in range(40)]), st.none() | st.integers(-5, 5), max_size=15),
            st.booleans(),  # compact every subtask this time
        ),
        min_size=1,
        max_size=6,
    ),
    restore_parallelism=st.integers(1, 7),
)
def test_any_range_restores_to_the_model(tmp_path_factory, steps, restore_parallelism) -> None:
    checkpoint = new_checkpoint(tmp_path_factory.mktemp("ckpt"))
    model: dict[str, int | None] = {}
    manifest = None
    for version, (parallelism, updates, compact) in enumerate(steps):
        compacting = frozenset(range(parallelism)) if compact else frozenset()
        manifest = write_version(checkpoint, version, parallelism, updates, manifest, compacting)
        model.update(updates)
    for subtask in range(restore_parallelism):
        first, last = key_group_range(K, restore_parallelism, subtask)
        assert restored(checkpoint, manifest, first, last) == in_range(model, first, last)


def test_compaction_drops_superseded_files_and_cleared_keys(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(tmp_path)
    manifest = write_version(checkpoint, 0, 2, {"a": 1, "b": 2}, None)
    manifest = write_version(checkpoint, 1, 2, {"a": None}, manifest)  # clear a
    assert [f.kind for f in manifest.operators["1"]] == ["delta"] * 4
    manifest = write_version(checkpoint, 2, 2, {"c": 3}, manifest, frozenset({0, 1}))
    assert {f.kind for f in manifest.operators["1"]} == {"full"}  # older deltas no longer needed
    assert restored(checkpoint, manifest, 0, K - 1) == {"b": 2, "c": 3}  # a stays cleared


def test_retention_keeps_the_newest_versions_and_their_files(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(tmp_path)
    manifest = None
    for version in range(5):
        manifest = write_version(checkpoint, version, 2, {f"u{version}": version}, manifest,
                                 frozenset({0, 1}) if version == 3 else frozenset())  # fmt: skip
    dropped = retain(checkpoint, 2)
    assert dropped == [0, 1, 2]
    assert checkpoint.manifests.versions() == [3, 4]
    on_disk = {str(p.relative_to(tmp_path)) for p in (tmp_path / "state").rglob("*.parquet")}
    used = {f.path for v in (3, 4) for f in checkpoint.manifests.read(v).operators["1"]}
    assert on_disk == used
    assert restored(checkpoint, checkpoint.manifests.read(4), 0, K - 1) == {f"u{v}": v for v in range(5)}


def test_retention_per_micro_batch_drops_what_the_full_retention_drops_without_listing(tmp_path: Path) -> None:
    """retain_known works from the manifests a run holds: the same versions and files go as
    with retain (which lists), and a directory left empty goes too."""
    checkpoint = new_checkpoint(tmp_path)
    manifests: list[Manifest] = []
    for version in range(5):
        manifests.append(write_version(checkpoint, version, 2, {f"u{version}": version},
                                       manifests[-1] if manifests else None,
                                       frozenset({0, 1}) if version == 3 else frozenset()))  # fmt: skip
    kept = retain_known(checkpoint, tuple(manifests), 2)
    assert [m.version for m in kept] == [3, 4]
    assert checkpoint.manifests.versions() == [3, 4]
    on_disk = {str(p.relative_to(tmp_path)) for p in (tmp_path / "state").rglob("*.parquet")}
    assert on_disk == {f.path for m in kept for f in m.operators["1"]}
    assert sorted(p.name for p in (tmp_path / "state/op-1").iterdir()) == ["v-0000000003", "v-0000000004"]
    assert restored(checkpoint, kept[-1], 0, K - 1) == {f"u{v}": v for v in range(5)}


def test_a_subtask_of_another_parallelism_reads_about_its_share_of_a_large_state_file(tmp_path: Path) -> None:
    """A state file of many rows is cut into row groups by key group: a quarter of its range
    reads under half of its bytes, each page checked by its CRC (a flipped byte in a page
    read is damage); the whole range is read whole, against the file's checksum."""
    checkpoint = new_checkpoint(tmp_path)
    rng = np.random.default_rng(5)
    rows = 8 * PART_ROWS
    table = pa.table({KEY_GROUP_COLUMN: pa.array(rng.integers(0, 1000, rows), pa.int32()),
                      "total": pa.array(rng.integers(0, 10**9, rows))})  # fmt: skip
    file = write_state_file(checkpoint, "1", 0, "full", 0, 999, table, rows)
    counting = CountingFiles(checkpoint.fs)
    checkpoint.fs = counting
    part = read_part(checkpoint, file, 0, 249)
    assert counting.read < file.bytes * 0.5  # a quarter, a part (an eighth) more at most, and the footer
    got = part.filter(pc.less_equal(part.column(KEY_GROUP_COLUMN), 249)).sort_by([(KEY_GROUP_COLUMN, "ascending"),
                                                                                  ("total", "ascending")])  # fmt: skip
    expected = table.filter(pc.less_equal(table.column(KEY_GROUP_COLUMN), 249))
    assert got.equals(expected.sort_by([(KEY_GROUP_COLUMN, "ascending"), ("total", "ascending")]))
    checkpoint.fs = counting.inner
    path = tmp_path / file.path
    metadata = pq.read_metadata(path)
    chunk = metadata.row_group(0).column(1)
    data = bytearray(path.read_bytes())
    original = bytes(data)
    data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF  # inside the first row group's values
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="was altered"):
        read_part(checkpoint, file, 0, 249)
    data = bytearray(original)
    data[-30] ^= 0xFF  # in the footer (its statistics could skip a row group): checked by the manifest's checksum
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="was altered"):
        read_part(checkpoint, file, 0, 249)
    path.write_bytes(original)
    checkpoint.fs = Unreachable(checkpoint.fs)  # a store that fails: an error of the storage, not damage
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        read_part(checkpoint, file, 0, 249)


class Unreachable:
    """A filesystem whose files cannot be read, as a store that stopped answering."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def open_input_file(self, path: str) -> object:
        opened = self.inner.open_input_file(path)  # type: ignore[attr-defined]

        class Failing:
            def __enter__(self) -> Failing:
                return self

            def __exit__(self, *exc: object) -> None:
                opened.close()

            def size(self) -> int:
                return int(opened.size())

            def read_at(self, nbytes: int, offset: int) -> bytes:
                raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation")

        return Failing()


def test_uncommitted_versions_are_discarded(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(tmp_path)
    manifest = write_version(checkpoint, 0, 2, {"a": 1}, None)
    (tmp_path / "manifests" / "0000000001.json.tmp-abc").write_text("half a manifest")  # a crash mid-write
    write_version(checkpoint, 1, 2, {"a": 5}, manifest)
    (tmp_path / "manifests" / "0000000001.json").unlink()  # version 1 never committed
    assert checkpoint.manifests.versions() == [0]
    checkpoint.state_files.discard_after(0)
    assert not (tmp_path / "state" / "op-1" / "v-0000000001").exists()
    assert restored(checkpoint, checkpoint.manifests.latest(), 0, K - 1) == {"a": 1}


def test_state_cached_by_an_uncommitted_attempt_is_not_reused(tmp_path: Path) -> None:
    """Run A writes version 1 but never commits it; run B commits its own version 1 (on
    another worker); run B's next batch on A's worker must not use A's cached version 1."""
    checkpoint = new_checkpoint(tmp_path)
    committed = write_version(checkpoint, 0, 1, {"a": 1}, None, run="A")
    write_version(checkpoint, 1, 1, {"a": 100}, committed, run="A", commit=False)
    checkpoint.state_files.discard_after(0)
    first, last = key_group_range(K, 1, 0)
    store = KeyedStateStore(STATE)  # run B's version 1, built elsewhere: only its file reaches this process
    restore(checkpoint, committed.operators["1"], first, last, store, K)
    slots = store.slots(pa.table({"user": ["a"]}), assign_to_key_groups(pa.array(["a"]), K).astype(np.int32))
    store.columns["total"].set(slots, pa.array([2], pa.int64()))
    file = write_state_file(checkpoint, "1", 1, "delta", first, last, store.to_table(slots), 1)
    files = needed_files([*committed.operators["1"], file], K)
    checkpoint.manifests.commit(Manifest(1, 1, K, {"1": files}))
    backend = CheckpointedState(checkpoint.uri, checkpoint.root, "B", "1", 1, 2, tuple(files), frozenset(), K)
    reopened = backend.open(STATE, 0, first, last)
    assert reopened.columns["total"].get(reopened.slots(pa.table({"user": ["a"]}))).to_pylist() == [2]


def test_compaction_depth_counts_deltas_per_key_group(tmp_path: Path) -> None:
    """Three versions at parallelism 8 are three deltas deep for every key group, not 24."""
    checkpoint = new_checkpoint(tmp_path)
    manifest = None
    for version in range(3):
        manifest = write_version(checkpoint, version, 8, {f"u{version}": version}, manifest)
    depth = delta_depth(manifest.operators["1"], K)
    assert depth.max() == 3
    assert depth.min() == 3


def test_cleared_keys_are_not_counted_and_compaction_drops_them(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(tmp_path)
    manifest = write_version(checkpoint, 0, 1, {f"u{i}": i for i in range(100)}, None)
    manifest = write_version(checkpoint, 1, 1, {f"u{i}": None for i in range(100)}, manifest)
    manifest = write_version(checkpoint, 2, 1, {"z": 7}, manifest, frozenset({0}))
    (full,) = manifest.operators["1"]
    assert (full.kind, full.rows, full.keys_in_range) == ("full", 1, 1)
    assert restored(checkpoint, manifest, 0, K - 1) == {"z": 7}


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 300), max_size=80), max_size=12))
def test_key_index_matches_a_dict(batches) -> None:
    import pandas as pd

    index, model = KeyIndex(), {}
    for batch in batches:
        keys = pd.Index(list(dict.fromkeys(batch)), dtype="int64")
        slots = index.lookup(keys)
        assert slots.tolist() == [model.get(k, -1) for k in keys]
        new = slots < 0
        for key, slot in zip(keys[new], index.add(keys[new]), strict=True):
            model[key] = int(slot)


KEY_ROWS = st.tuples(st.sampled_from(["a", "b", "", "ü", None]), st.integers(-2, 2), st.sampled_from([0, 60, 120]))


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(KEY_ROWS, max_size=40), max_size=10), columns=st.integers(1, 3))
def test_key_table_matches_a_dict(batches, columns) -> None:
    """Keys of one to three columns (a string with nulls, an int, a timestamp): slots as a
    dict of tuples gives them, and ``take`` gives back the keys with their types."""
    schema = pa.schema([("s", pa.string()), ("i", pa.int64()), ("t", pa.timestamp("us", tz="UTC"))][:columns])
    table, model = KeyTable(), {}
    for batch in batches:
        rows = list(dict.fromkeys(row[:columns] for row in batch))
        keys = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema=schema)
        slots = table.lookup(keys)
        assert slots.tolist() == [model.get(row, -1) for row in rows]
        new = slots < 0
        added = table.add(keys.filter(pa.array(new)))
        for row, slot in zip([r for r, n in zip(rows, new, strict=True) if n], added, strict=True):
            model[row] = int(slot)
    in_order = sorted(model, key=model.get)
    assert table.size == len(model)
    if model:
        taken = table.take(np.arange(len(model))[::-1])
        assert taken.schema == schema
        as_ints = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in taken.columns]
        assert list(zip(*(c.to_pylist() for c in as_ints), strict=True)) == in_order[::-1]


def test_a_key_column_beyond_2_31_distinct_values_is_a_clear_error() -> None:
    with pytest.raises(OverflowError, match=r"more than 2\*\*31 distinct values of a key column in one subtask; raise"):
        PairCodes().add(np.array([2**31], dtype=np.int64), np.array([0], dtype=np.int64))


def test_a_checkpoint_workers_cannot_see_is_an_error(tmp_path: Path) -> None:
    backend = CheckpointedState(str(tmp_path / "elsewhere"), "id", "run", "1", -1, 0, (), frozenset(), K)
    with pytest.raises(RuntimeError, match=r"elsewhere is not visible from Spark's workers; on a cluster put"):
        backend.open(STATE, 0, 0, K - 1)


def test_a_manifest_of_another_format_is_refused(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(tmp_path)
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "0000000000.json").write_text('{"format_version": 99}')
    with pytest.raises(CheckpointError, match=r"0000000000.json has format 99, which this keyflow does not read: it "
                                              r"was written by another keyflow version") as raised:  # fmt: skip
        checkpoint.manifests.latest()
    assert not isinstance(raised.value, DamagedFileError)  # not damage: a rollback would not help
    with pytest.raises(CheckpointError, match="has format 99"):
        verify(checkpoint)
