"""Pre-keyed sources: ``reinterpret_as_keyed`` right after a log whose splits are partitioned by
key. The keyed operators read their subtask's splits with no shuffle; the split → key-group
mapping is persisted and rescales; a key in two splits is caught. Answers come from pandas
and from ``key_by`` on the same log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from keyflow import KeyedBatch, KeyedState, Log, Pipeline, parquet
from keyflow.cli.app import app
from keyflow.connectors.streams import log
from keyflow.errors import DataError, PipelineError, PlanError, RestoreError
from keyflow.keygroups import key_group_range, split_key_groups
from keyflow.runtime.metrics import ShuffleMeter
from keyflow.runtime.session import spark_session
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.seal import checksum
from tests.streams import EVENTS, TOTAL_SCHEMA, TOTAL_STATE, config, events, expected_totals, read_output, running_total


def write_log(path: Path, frame: pd.DataFrame, splits: int) -> None:
    target = Log(path) if (path / "_log.json").exists() else Log.create(path, splits, EVENTS)
    target.append(pa.Table.from_pandas(frame, schema=EVENTS, preserve_index=False), key="user")


def append_to_split(path: Path, frame: pd.DataFrame, split: int) -> None:
    Log(path).append(pa.Table.from_pandas(frame, schema=EVENTS, preserve_index=False), split=split)


def pre_keyed_pipeline(base: Path, parallelism: int, rows_per_batch: int | None = None, **extra: object) -> Pipeline:
    """Running totals (process with state) and count/sum (aggregate) on the pre-keyed log."""
    p = Pipeline(config=config(parallelism, **extra))
    keyed = p.source(log(str(base / "log"), rows_per_batch=rows_per_batch)).reinterpret_as_keyed("user")
    keyed.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(parquet(str(base / "totals")))
    keyed.aggregate(n="count(*)", amount="sum(amount)").sink(parquet(str(base / "sums")))
    return p


def final_sums(path: Path) -> pd.DataFrame:
    """The newest update of every user (``n`` grows with every event of the user)."""
    updates = read_output(path)
    newest = updates.sort_values(["user", "n"]).groupby("user").tail(1)
    return newest.sort_values("user").reset_index(drop=True)[["user", "n", "amount"]]


def expected_sums(all_events: pd.DataFrame) -> pd.DataFrame:
    grouped = all_events.groupby("user").agg(n=("amount", "size"), amount=("amount", "sum")).reset_index()
    return grouped.sort_values("user").reset_index(drop=True)


def assert_answers(base: Path, all_events: pd.DataFrame) -> None:
    totals = read_output(base / "totals").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(totals, expected_totals(all_events).reset_index(drop=True), check_dtype=False)
    pd.testing.assert_frame_equal(final_sums(base / "sums"), expected_sums(all_events), check_dtype=False)


# Every parallelism 1..3 and split count 1, 7, 64 appears: fewer splits than subtasks (idle
# subtasks), splits not a multiple of the parallelism, and many splits per subtask.
@pytest.mark.jvm
@pytest.mark.parametrize(("parallelism", "splits"), [(1, 7), (2, 1), (3, 64)])
def test_results_equal_key_by_and_pandas(tmp_path: Path, parallelism: int, splits: int) -> None:
    """Both ways over one log in one run: reinterpret_as_keyed and key_by give pandas' answer."""
    all_events = events(4_000, 300, start=0, seed=parallelism * 100 + splits)
    write_log(tmp_path / "log", all_events, splits)
    p = Pipeline(config=config(parallelism))
    source = p.source(log(str(tmp_path / "log"), rows_per_batch=1_500))
    for how, keyed in (("pre", source.reinterpret_as_keyed("user")), ("key_by", source.key_by("user"))):
        totals = keyed.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq", name=f"totals-{how}")
        totals.sink(parquet(str(tmp_path / how / "totals")))
        sums = keyed.aggregate(n="count(*)", amount="sum(amount)").set_name(f"sums-{how}")
        sums.sink(parquet(str(tmp_path / how / "sums")))
    result = p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 3
    for how in ("pre", "key_by"):
        assert_answers(tmp_path / how, all_events)


@pytest.mark.jvm
def test_each_subtask_reads_its_key_groups_splits_with_no_shuffle(tmp_path: Path) -> None:
    """Partition i holds exactly subtask i's key groups: each row's key group is its split's
    (from the persisted mapping) and lies in the range of the subtask that processed it; and
    Spark's shuffle wrote no byte."""
    all_events = events(6_000, 400, start=0, seed=5)
    write_log(tmp_path / "log", all_events, 7)
    split_of = _split_of_users(tmp_path / "log")

    def where(batch: KeyedBatch, state: KeyedState) -> pa.Table:
        return pa.table(
            {
                "user": batch.keys.column("user"),
                "subtask": pa.array(np.full(batch.num_keys, batch.subtask, dtype=np.int32)),
                "key_group": pa.array(batch.key_groups),
            }
        )

    p = Pipeline(config=config(3))
    p.source(log(str(tmp_path / "log"))).reinterpret_as_keyed("user").process(
        where, "user string, subtask int, key_group int"
    ).sink(parquet(str(tmp_path / "where")))
    spark = spark_session({"spark.master": "local[2]"})
    meter = ShuffleMeter(spark)
    p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert meter.written() == 0
    hashed = Pipeline(config=config(3))  # the meter sees a shuffle where there is one
    hashed.source(log(str(tmp_path / "log"))).key_by("user").process(
        where, "user string, subtask int, key_group int"
    ).sink(parquet(str(tmp_path / "hashed")))
    meter = ShuffleMeter(spark)
    hashed.run(checkpoint=str(tmp_path / "ckpt-hashed"), available_now=True)
    assert meter.written() > 0

    seen = read_output(tmp_path / "where")
    manifest = Checkpoint(str(tmp_path / "ckpt")).manifests.latest()
    assert manifest is not None
    mapping = manifest.pre_keyed["splits"]
    assert mapping == split_key_groups([], 7, manifest.max_parallelism)
    assert set(seen["user"]) == set(all_events["user"])
    assert (seen["key_group"] == seen["user"].map(split_of).map(lambda split: mapping[split])).all()
    for subtask, key_group in zip(seen["subtask"], seen["key_group"], strict=True):
        first, last = key_group_range(manifest.max_parallelism, 3, int(subtask))
        assert first <= key_group <= last


def _split_of_users(path: Path) -> dict[str, int]:
    target = Log(path)
    return {
        user: split
        for split, end in enumerate(target.end_offsets())
        for batch in target.read(split, 0, end)
        for user in batch.column("user").to_pylist()
    }


@pytest.mark.jvm
def test_restart_at_other_parallelisms_with_splits_added_in_between(tmp_path: Path) -> None:
    """2 → 3 → 1 with new splits (and new keys in them) added between runs; the mapping of the
    first run is kept, new splits get key groups of their own; no state file is rewritten."""
    parts = [events(2_000, 150, start=0, seed=1)]
    write_log(tmp_path / "log", parts[0], 4)
    checkpoint = str(tmp_path / "ckpt")
    pre_keyed_pipeline(tmp_path, 2, **{"state.checkpoints.num-retained": 100}).run(checkpoint, available_now=True)
    first_mapping = Checkpoint(checkpoint).manifests.latest().pre_keyed["splits"]  # type: ignore[union-attr]
    before = _state_files(tmp_path / "ckpt")

    assert Log(tmp_path / "log").add_splits(2) == 6
    parts.append(events(1_500, 150, start=2_000, seed=2))  # known users, in their splits
    write_log_by_split(tmp_path / "log", parts[-1])
    parts.append(_new_users(events(500, 40, start=3_500, seed=3), "new4-"))
    append_to_split(tmp_path / "log", parts[-1], 4)
    pre_keyed_pipeline(tmp_path, 3, **{"state.checkpoints.num-retained": 100}).run(checkpoint, available_now=True)

    parts.append(_new_users(events(500, 30, start=4_000, seed=4), "new5-"))
    append_to_split(tmp_path / "log", parts[-1], 5)
    parts.append(events(800, 150, start=4_500, seed=5))
    write_log_by_split(tmp_path / "log", parts[-1])
    pre_keyed_pipeline(tmp_path, 1, **{"state.checkpoints.num-retained": 100}).run(checkpoint, available_now=True)

    manifest = Checkpoint(checkpoint).manifests.latest()
    assert manifest is not None
    assert manifest.parallelism == 1
    assert manifest.pre_keyed["splits"][:4] == first_mapping
    assert len(set(manifest.pre_keyed["splits"])) == 6
    after = _state_files(tmp_path / "ckpt")
    assert {path: after[path] for path in before} == before
    assert_answers(tmp_path, pd.concat(parts))


def write_log_by_split(path: Path, frame: pd.DataFrame) -> None:
    """Append users already in the log to the split they are in (the external partitioner's
    promise: a key stays in its split, even after splits are added)."""
    split_of = _split_of_users(path)
    for split, rows in frame.groupby(frame["user"].map(split_of)):
        append_to_split(path, rows, int(split))


def _new_users(frame: pd.DataFrame, prefix: str) -> pd.DataFrame:
    return frame.assign(user=prefix + frame["user"])


def _state_files(checkpoint: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(checkpoint)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (checkpoint / "state").rglob("*.parquet")
        if p.name.startswith(("delta-", "full-"))
    }


@pytest.mark.jvm
def test_live_rescale_and_a_split_added_while_running(tmp_path: Path) -> None:
    """Live 2 → 4 → 2: a rescale takes effect from the micro-batch after the next (Spark plans
    a batch's source partitions before it runs); the source's tasks follow it."""
    parts = [events(1_500, 120, start=0, seed=11)]
    write_log(tmp_path / "log", parts[0], 5)
    job = pre_keyed_pipeline(tmp_path, 2, **{"state.checkpoints.num-retained": 100}).start(str(tmp_path / "ckpt"))
    try:
        job.process_all_available()
        before = _state_files(tmp_path / "ckpt")
        job.rescale(4, reason="test")
        for number, seed in enumerate((12, 13)):
            parts.append(events(1_000, 120, start=1_500 + 1_000 * number, seed=seed))
            write_log_by_split(tmp_path / "log", parts[-1])
            job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 4
        Log(tmp_path / "log").add_splits(1)
        job.rescale(2, reason="test")
        for number, seed in enumerate((14, 15)):
            parts.append(_new_users(events(700, 20, start=3_500 + 700 * number, seed=seed), "live-"))
            append_to_split(tmp_path / "log", parts[-1], 5)
            job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 2
    finally:
        job.stop()
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    assert [(e["from"], e["to"]) for e in checkpoint.events()] == [(2, 4), (4, 2)]
    after = _state_files(tmp_path / "ckpt")
    assert {path: after[path] for path in before} == before  # state moved with key groups, no file rewritten
    assert_answers(tmp_path, pd.concat(parts))


@pytest.mark.jvm
def test_kill_9_mid_batch_then_restart(tmp_path: Path) -> None:
    """The driver killed after the sinks wrote micro-batch 1 but before its commit; a split is
    added: the restart (in this process) at another parallelism replays the batch, maps the new
    split, and the answer is pandas' (no lost or doubled row)."""
    parts = [events(3_000, 200, start=0, seed=21)]
    write_log(tmp_path / "log", parts[0], 6)
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from pathlib import Path
            sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
            from tests.test_pre_keyed import pre_keyed_pipeline
            base = Path({str(tmp_path)!r})
            pre_keyed_pipeline(base, int(sys.argv[1]), rows_per_batch=1_000).run(str(base / "ckpt"), available_now=True)
            """
        )
    )
    env = {**os.environ, "KEYFLOW_FAULT": "after-sink-write:1"}
    crashed = subprocess.run([sys.executable, str(script), "2"], env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert Checkpoint(str(tmp_path / "ckpt")).manifests.versions()[-1] == 0
    parts.append(events(1_000, 200, start=3_000, seed=22))
    write_log_by_split(tmp_path / "log", parts[-1])
    Log(tmp_path / "log").add_splits(1)
    parts.append(_new_users(events(400, 30, start=4_000, seed=23), "after-kill-"))
    append_to_split(tmp_path / "log", parts[-1], 6)
    pre_keyed_pipeline(tmp_path, 3, rows_per_batch=1_000).run(str(tmp_path / "ckpt"), available_now=True)
    assert_answers(tmp_path, pd.concat(parts))


@pytest.mark.jvm
def test_a_key_in_two_splits_stops_the_job_before_the_batch_commits(tmp_path: Path) -> None:
    """Found in one micro-batch (two splits, possibly read by two subtasks) and across
    micro-batches (a key first seen in one split comes back in another)."""
    first = events(1_000, 50, start=0, seed=31)
    write_log(tmp_path / "log", first, 4)
    checkpoint = str(tmp_path / "ckpt")
    pre_keyed_pipeline(tmp_path, 2).run(checkpoint, available_now=True)
    committed = Checkpoint(checkpoint).manifests.versions()
    published = sorted(p.name for p in (tmp_path / "totals").glob("part-*"))

    split_of = _split_of_users(tmp_path / "log")
    moved = pd.DataFrame({"user": ["u7"], "amount": [1], "seq": [5_000]})
    append_to_split(tmp_path / "log", moved, (split_of["u7"] + 1) % 4)
    with pytest.raises(
        DataError,
        match=rf"source 'source: log' is read as pre-keyed by \['user'\], but key \{{'user': 'u7'\}} in splits "
        rf"{split_of['u7']} and {(split_of['u7'] + 1) % 4} \(micro-batch 1\): a key must be in exactly one split.*"
        r"Nothing of it was committed.*key_by\('user'\) instead of reinterpret_as_keyed",
    ):
        pre_keyed_pipeline(tmp_path, 2).run(checkpoint, available_now=True)
    assert Checkpoint(checkpoint).manifests.versions() == committed
    assert sorted(p.name for p in (tmp_path / "totals").glob("part-*")) == published


@pytest.mark.jvm
def test_a_new_key_in_two_splits_of_one_batch_is_caught(tmp_path: Path) -> None:
    rows = pd.DataFrame({"user": ["x", "y"], "amount": [1, 2], "seq": [0, 1]})
    Log.create(tmp_path / "log", 3, EVENTS)
    append_to_split(tmp_path / "log", rows, 0)
    append_to_split(tmp_path / "log", rows.iloc[:1].assign(seq=2), 2)
    with pytest.raises(DataError, match=r"key \{'user': 'x'\} in splits 0 and 2 \(micro-batch 0\)"):
        pre_keyed_pipeline(tmp_path, 2).run(str(tmp_path / "ckpt"), available_now=True)
    assert Checkpoint(str(tmp_path / "ckpt")).manifests.versions() == []


@pytest.mark.jvm
def test_an_aggregate_alone_names_the_key_in_two_splits_not_its_neighbour(tmp_path: Path) -> None:
    """The aggregate groups rows by hashing (arrival order differs from grouped order): the key
    reported is the one whose rows came from two splits."""
    Log.create(tmp_path / "log", 2, EVENTS)
    append_to_split(tmp_path / "log", pd.DataFrame({"user": ["x", "y"], "amount": [1, 2], "seq": [0, 1]}), 0)
    append_to_split(tmp_path / "log", pd.DataFrame({"user": ["x"], "amount": [3], "seq": [2]}), 1)
    p = Pipeline(config=config(1))
    keyed = p.source(log(str(tmp_path / "log"))).reinterpret_as_keyed("user")
    keyed.aggregate(n="count(*)").sink(parquet(str(tmp_path / "sums")))
    with pytest.raises(PipelineError, match=r"key \{'user': 'x'\} in splits 0 and 1 \(micro-batch 0\)"):
        p.run(str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_warn_counts_keys_in_two_splits_and_goes_on(tmp_path: Path) -> None:
    rows = pd.DataFrame({"user": ["x", "y", "z"], "amount": [1, 2, 3], "seq": [0, 1, 2]})
    Log.create(tmp_path / "log", 2, EVENTS)
    append_to_split(tmp_path / "log", rows, 0)
    append_to_split(tmp_path / "log", rows.iloc[:2].assign(seq=[3, 4]), 1)
    p = pre_keyed_pipeline(tmp_path, 1, **{"pipeline.pre-keyed.verify": "warn"})
    result = p.run(str(tmp_path / "ckpt"), available_now=True)
    assert [batch.pre_keyed_conflicts for batch in result.batches] == [2]
    assert Checkpoint(str(tmp_path / "ckpt")).manifests.versions() == [0]


@pytest.mark.jvm
def test_verify_off_checks_nothing(tmp_path: Path) -> None:
    rows = pd.DataFrame({"user": ["x"], "amount": [1], "seq": [0]})
    Log.create(tmp_path / "log", 2, EVENTS)
    append_to_split(tmp_path / "log", rows, 0)
    append_to_split(tmp_path / "log", rows.assign(seq=1), 1)
    p = pre_keyed_pipeline(tmp_path, 2, **{"pipeline.pre-keyed.verify": "off"})
    result = p.run(str(tmp_path / "ckpt"), available_now=True)
    assert [batch.pre_keyed_conflicts for batch in result.batches] == [0]
    assert not list((tmp_path / "ckpt" / "state").rglob("keys-*.parquet"))
    manifest = Checkpoint(str(tmp_path / "ckpt")).manifests.latest()
    assert manifest is not None
    assert manifest.pre_keyed["complete"] is False  # the index misses these keys


@pytest.mark.jvm
def test_the_split_index_holds_every_key_once_in_few_files(tmp_path: Path) -> None:
    """Eight micro-batches of new keys: the index files merge as a binary counter (fewer files
    than batches), and together hold each key once with its split's key group."""
    Log.create(tmp_path / "log", 4, EVENTS)
    all_events = pd.concat(
        _new_users(events(100, 25, start=100 * number, seed=70 + number), f"b{number}-") for number in range(8)
    )
    write_log(tmp_path / "log", all_events, 4)
    result = pre_keyed_pipeline(tmp_path, 2, rows_per_batch=100).run(str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) == 8
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    manifest = checkpoint.manifests.latest()
    assert manifest is not None
    split_of, mapping = _split_of_users(tmp_path / "log"), manifest.pre_keyed["splits"]
    for uid, files in manifest.pre_keyed["index"].items():
        assert len(files) < 8, uid
        index = pd.concat(pd.read_parquet(checkpoint.path(path)) for path, *_ in files)
        assert sum(rows for _, rows, *_ in files) == len(index) == all_events["user"].nunique()
        for path, _, size, digest in files:  # recorded at commit, for the checks before a restore
            assert (size, digest) == (len(data := Path(checkpoint.path(path)).read_bytes()), checksum(data))
        assert index["user"].is_unique
        assert (index["__keyflow_key_group"] == index["user"].map(split_of).map(mapping.__getitem__)).all()


@pytest.mark.jvm
def test_more_splits_than_key_groups_is_a_clear_error(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 9, EVENTS)
    p = pre_keyed_pipeline(tmp_path, 2, **{"pipeline.max-parallelism": 8})
    with pytest.raises(
        PlanError,
        match=r"source 'source: log' \(pre-keyed by \['user'\]\): the source has 9 splits, more than the max "
        r"parallelism 8.*Set pipeline.max-parallelism to at least 9",
    ):
        p.run(str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_a_log_with_fewer_splits_than_the_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    write_log(tmp_path / "log", events(300, 20, start=0, seed=1), 5)
    pre_keyed_pipeline(tmp_path, 2).run(str(tmp_path / "ckpt"), available_now=True)
    meta = tmp_path / "log" / "_log.json"
    described = json.loads(meta.read_text())
    meta.write_text(json.dumps({**described, "splits": 3}))
    with pytest.raises(PlanError, match=r"the source has 3 splits but the checkpoint maps 5 splits to key groups"):
        pre_keyed_pipeline(tmp_path, 2).run(str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda p, path: p.source(log(path), parallelism=1).reinterpret_as_keyed("user").aggregate(n="count(*)"),
            r"reinterprets source 'source: log' as keyed at parallelism 2, but the source runs at 1",
        ),
        (
            lambda p, path: (
                p.source(log(path))
                .with_columns(user="upper(user)")
                .reinterpret_as_keyed("user")
                .aggregate(n="count(*)")
            ),
            r"with_columns 'with_columns' before it writes key column\(s\) \['user'\]",
        ),
        (
            lambda p, path: p.source(log(path)).select("user").reinterpret_as_keyed("user").aggregate(n="count(*)"),
            r"select 'select' may change the key columns; reinterpret_as_keyed follows a keyed operator \(process, "
            r"aggregate\) or a log source",
        ),
        (
            lambda p, path: (
                s := p.source(log(path)),
                s.reinterpret_as_keyed("user").aggregate(n="count(*)"),
                s.reinterpret_as_keyed("seq").aggregate(m="count(*)"),
            )[1:],
            r"source 'source: log' is reinterpreted as keyed by \['user'\] and by \['seq'\]",
        ),
        (
            lambda p, path: (
                p.source(log(path))
                .reinterpret_as_keyed("user")
                .process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE)
                .reinterpret_as_keyed("user")
                .aggregate(n="count(*)")
            ),
            r"but process 'running_total' before it reads a pre-keyed source, whose key groups come from its splits, "
            r"not from the key hash; do both steps in 'running_total' \(one process function\), or use key_by",
        ),
    ],
)
def test_plan_errors(tmp_path: Path, build: object, message: str) -> None:
    Log.create(tmp_path / "log", 2, EVENTS)
    p = Pipeline(config=config(2))
    with pytest.raises(PlanError, match=message):
        _plan(build, p, str(tmp_path / "log"))


def _plan(build: object, p: Pipeline, path: str) -> None:
    built = build(p, path)  # type: ignore[operator]
    for number, stream in enumerate(built if isinstance(built, tuple) else (built,)):
        stream.sink(parquet(f"{path}-out{number}"))
    p.plan()


@pytest.mark.jvm
def test_filters_and_with_columns_keep_the_source_pre_keyed(tmp_path: Path) -> None:
    all_events = events(2_000, 100, start=0, seed=41)
    write_log(tmp_path / "log", all_events, 5)
    p = Pipeline(config=config(2))
    keyed = (
        p.source(log(str(tmp_path / "log")))
        .filter("amount > 0")
        .with_columns(double="amount * 2")
        .reinterpret_as_keyed("user")
    )
    keyed.aggregate(n="count(*)", doubled="sum(double)").sink(parquet(str(tmp_path / "out")))
    assert "hash" not in [edge.partitioner.value for edge in p.plan().edges]
    p.run(str(tmp_path / "ckpt"), available_now=True)
    positive = all_events[all_events["amount"] > 0]
    want = positive.groupby("user").agg(n=("amount", "size"), doubled=("amount", "sum")).reset_index()
    want["doubled"] *= 2
    got = read_output(tmp_path / "out").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.sort_values("user").reset_index(drop=True), check_dtype=False)


@pytest.mark.jvm
def test_the_example_runs_rescaled_and_equals_pandas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/pre_keyed.py as a user runs it: keyflow run, more clicks, keyflow run -p 3 (the
    runs in this process, on the shared SparkSession; the appending script in its own)."""
    example = Path(__file__).resolve().parent.parent / "examples" / "pre_keyed.py"
    monkeypatch.chdir(tmp_path)  # the example's paths are relative
    run = ["run", str(example), "--checkpoint", "ckpt", "--available-now", "--conf", "pipeline.progress=off"]
    first = CliRunner().invoke(app, run)
    assert first.exit_code == 0, first.output
    more = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert more.returncode == 0, more.stdout + more.stderr
    second = CliRunner().invoke(app, [*run, "-p", "3"])
    assert second.exit_code == 0, second.output
    assert "parallelism 3" in second.stdout

    clicks = Log(tmp_path / "data" / "pre_keyed_clicks")
    rows = pa.concat_tables(
        pa.Table.from_batches(list(clicks.read(split, 0, end))) for split, end in enumerate(clicks.end_offsets())
    ).to_pandas()
    assert len(rows) == 400_000
    want = rows.groupby("user").agg(clicks=("price", "size"), revenue=("price", "sum")).reset_index()
    updates = read_output(tmp_path / "out" / "pre_keyed" / "per_user")
    got = updates.sort_values(["user", "clicks"]).groupby("user").tail(1).sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.sort_values("user").reset_index(drop=True), check_dtype=False)
    spend = read_output(tmp_path / "out" / "pre_keyed" / "running_spend").sort_values("seq")
    ordered = rows.sort_values("seq")
    assert np.allclose(spend["spend"].to_numpy(), ordered.groupby("user")["price"].cumsum().to_numpy())


@pytest.mark.jvm
def test_switching_between_key_by_and_pre_keyed_on_a_checkpoint_is_refused(tmp_path: Path) -> None:
    """State under split key groups is not where key_by looks for it (and the other way round)."""
    write_log(tmp_path / "log", events(500, 30, start=0, seed=51), 4)
    checkpoint = str(tmp_path / "ckpt")
    pre_keyed_pipeline(tmp_path, 2).run(checkpoint, available_now=True)
    p = Pipeline(config=config(2))
    keyed = p.source(log(str(tmp_path / "log"))).key_by("user")
    keyed.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(parquet(str(tmp_path / "a")))
    keyed.aggregate(n="count(*)", amount="sum(amount)").sink(parquet(str(tmp_path / "b")))
    with pytest.raises(
        RestoreError,
        match=r"operator 'running_total' .*: it now takes its key groups from the key hash, the checkpoint from a "
        r"pre-keyed source's splits\. Change it back",
    ):
        p.run(checkpoint, available_now=True)


@pytest.mark.jvm
def test_dead_letters_of_a_key_by_beside_a_pre_keyed_branch_keep_the_source_columns(tmp_path: Path) -> None:
    rows = pd.DataFrame({"user": ["x", None, "y"], "amount": [1, 2, 3], "seq": [0, 1, 2]})
    Log.create(tmp_path / "log", 2, EVENTS)
    append_to_split(tmp_path / "log", rows.iloc[[0, 2]], 0)
    append_to_split(tmp_path / "log", rows.iloc[[1]], 1)
    p = Pipeline(config=config(2, **{"pipeline.pre-keyed.verify": "off"}))
    source = p.source(log(str(tmp_path / "log")))
    pre_keyed = source.filter("user IS NOT NULL").reinterpret_as_keyed("user")
    pre_keyed.aggregate(n="count(*)").set_name("pre").sink(parquet(str(tmp_path / "pre")))
    hashed = source.key_by("user", on_null=parquet(str(tmp_path / "dead")))
    hashed.aggregate(n="count(*)").set_name("hashed").sink(parquet(str(tmp_path / "hashed")))
    p.run(str(tmp_path / "ckpt"), available_now=True)
    dead = read_output(tmp_path / "dead")
    assert list(dead.columns) == ["user", "amount", "seq"]
    assert dead.to_dict("records") == [{"user": None, "amount": 2, "seq": 1}]


@pytest.mark.jvm
def test_an_upsert_reader_stops_when_the_log_is_no_longer_split_by_its_key(tmp_path: Path) -> None:
    """Splits added to a keyed log while a changelog pipeline reads it: the changes of a key may
    now be in two splits, out of order; the reader says so instead of reading them."""
    write_log(tmp_path / "log", events(300, 20, start=0, seed=61), 2)
    p = Pipeline(config=config(2))
    p.source(log(str(tmp_path / "log"), changelog_mode="upsert", primary_key="user")).sink(
        parquet(str(tmp_path / "out"), primary_key="user")
    )
    job = p.start(checkpoint=str(tmp_path / "ckpt"))
    try:
        job.process_all_available()
        Log(tmp_path / "log").add_splits(1)
        write_log(tmp_path / "log", events(100, 20, start=300, seed=62), 2)
        with pytest.raises(PipelineError, match=r"no longer split by a key .*keyflow log append --key"):
            job.process_all_available()
    finally:
        job.stop()
