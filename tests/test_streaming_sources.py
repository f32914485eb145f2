"""Unbounded sources on a real local Spark, and what a failed micro-batch leaves behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import KeyflowError, Log, Pipeline, PlanError, datagen, files, log, parquet, random_float, random_int
from keyflow.errors import RestoreError
from keyflow.state.checkpoint import Checkpoint
from tests.streams import EVENTS, TOTAL_SCHEMA, TOTAL_STATE, append, config, events, expected_totals, read_output


def latest_per_key(output: pd.DataFrame, key: str) -> pd.DataFrame:
    """A streaming aggregate's answer: each key's last update (files are read in batch order)."""
    return output.groupby(key).last().sort_index()


@pytest.mark.jvm
def test_unbounded_datagen_gives_the_rows_of_bounded_datagen(spark, tmp_path: Path) -> None:
    fields = {"k": random_int(1, 300), "v": random_float(0, 10)}
    stream = Pipeline(config=config(2))
    stream.source(datagen(rows=3_000, rows_per_second=1e9, rows_per_batch=1_000, fields=fields, seed=4)).key_by(
        "k"
    ).aggregate(n="count(*)", total="sum(v)", low="min(v)", mean="avg(v)").sink(parquet(tmp_path / "out"))
    result = stream.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert [b.input_rows for b in result.batches] == [1_000, 1_000, 1_000]

    rows = Pipeline(config=config(2)).source(datagen(rows=3_000, fields=fields, seed=4)).to_pandas()
    expected = rows.groupby("k").agg(n=("v", "size"), total=("v", "sum"), low=("v", "min"), mean=("v", "mean"))
    got = latest_per_key(read_output(tmp_path / "out"), "k")
    pd.testing.assert_frame_equal(got[["n", "total", "low", "mean"]], expected, check_dtype=False)


@pytest.mark.jvm
def test_watched_directory_reads_new_files_once(spark, tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    frames = [pd.DataFrame({"user": rng.choice(["a", "b", "c", "d"], 500), "n": rng.integers(0, 9, 500)})]
    frames.append(pd.DataFrame({"user": rng.choice(["a", "e"], 300), "n": rng.integers(0, 9, 300)}))
    frames.append(pd.DataFrame({"user": rng.choice(["b", "f"], 200), "n": rng.integers(0, 9, 200)}))

    def run() -> None:
        p = Pipeline(config=config(2))
        source = files(incoming, schema="user string, n long", watch=True, maxFilesPerTrigger="1")
        p.source(source).key_by("user").aggregate(count="count(*)", total="sum(n)").sink(parquet(tmp_path / "out"))
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    for number, frame in enumerate(frames[:2]):
        frame.to_parquet(incoming / f"f{number}.parquet", index=False)
    run()
    frames[2].to_parquet(incoming / "f2.parquet", index=False)
    run()  # only the new file is read

    everything = pd.concat(frames)
    expected = everything.groupby("user").agg(count=("n", "size"), total=("n", "sum"))
    got = latest_per_key(read_output(tmp_path / "out"), "user")
    pd.testing.assert_frame_equal(got[["count", "total"]], expected, check_dtype=False)


def test_log_keeps_each_key_in_one_split_and_reads_ranges(tmp_path: Path) -> None:
    data = events(1_000, 50, start=0, seed=9)
    append(tmp_path / "log", data, splits=4)
    target = Log(tmp_path / "log")
    assert sum(target.end_offsets()) == 1_000
    splits_of_user: dict[str, set[int]] = {}
    for split, end in enumerate(target.end_offsets()):
        table = pa.Table.from_batches(list(target.read(split, 0, end)), schema=EVENTS)
        for user in set(table.column("user").to_pylist()):
            splits_of_user.setdefault(user, set()).add(split)
    assert all(len(splits) == 1 for splits in splits_of_user.values())
    middle = pa.Table.from_batches(list(target.read(0, 10, 20)), schema=EVENTS)
    whole = pa.Table.from_batches(list(target.read(0, 0, target.end_offsets()[0])), schema=EVENTS)
    assert middle.equals(whole.slice(10, 10))
    with pytest.raises(PlanError, match=r"records have columns \['user'\]; the log's schema is"):
        target.append(pa.table({"user": ["x"]}))
    with pytest.raises(PlanError, match=r"a log needs splits >= 1, got 0"):
        Log.create(tmp_path / "other", 0, EVENTS)


@pytest.mark.jvm
def test_failed_micro_batch_loses_nothing(spark, tmp_path: Path) -> None:
    """A process function that raises fails the batch with a clear error; after the fix the
    same checkpoint replays that batch and the output is complete and exact."""
    data = events(1_200, 40, start=0, seed=12)
    append(tmp_path / "log", data)

    def failing(batch, state):
        if (batch.data.column("seq").to_numpy() >= 900).any():
            raise ValueError("bad record")
        from tests.streams import running_total

        return running_total(batch, state)

    def pipeline(function) -> Pipeline:
        p = Pipeline(config=config(2))
        p.source(log(str(tmp_path / "log"), rows_per_batch=300)).key_by("user").process(
            function, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq", name="totals"
        ).sink(parquet(tmp_path / "out"))
        return p

    with pytest.raises(KeyflowError, match=r"process 'totals' raised ValueError: bad record"):
        pipeline(failing).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    from tests.streams import running_total

    pipeline(running_total).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)


@pytest.mark.jvm
def test_changed_key_type_is_refused(spark, tmp_path: Path) -> None:
    append(tmp_path / "log", events(200, 10, start=0, seed=2))

    def pipeline(key_expression: str) -> Pipeline:
        p = Pipeline(config=config(2))
        p.source(log(str(tmp_path / "log"))).with_columns(k=key_expression).key_by("k").aggregate(n="count(*)").sink(
            parquet(tmp_path / "out")
        )
        return p

    pipeline("user").run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    append(tmp_path / "log", events(10, 10, start=200, seed=3))
    with pytest.raises(RestoreError, match=r"key columns are now \{'k': 'binary'\} but .* keyed by \{'k': 'string'\}"):
        pipeline("cast(user as binary)").run(checkpoint=str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_batches_that_leave_a_keyed_operator_without_rows_commit(spark, tmp_path: Path) -> None:
    """A keyed subtask without rows writes no state file (its state is unchanged) and the stream goes on."""
    quiet = events(300, 10, start=0, seed=1)
    append(tmp_path / "log", quiet)

    def run() -> None:
        p = Pipeline(config=config(2))
        p.source(log(str(tmp_path / "log"))).filter("amount > 95").key_by("user").aggregate(big="count(*)").sink(
            parquet(tmp_path / "out")
        )
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    loud = events(300, 10, start=300, seed=2).assign(amount=99)
    run()
    append(tmp_path / "log", pd.DataFrame({"user": ["u1"], "amount": [0], "seq": [600]}))
    run()  # a batch in which the filter keeps nothing
    empty = Checkpoint(str(tmp_path / "ckpt")).manifests.versions()[-1]
    assert not list((tmp_path / "ckpt" / "state").glob(f"*/v-{empty:010d}/*"))  # no subtask restored or wrote
    append(tmp_path / "log", loud)
    run()
    everything = pd.concat([quiet, loud])
    expected = everything[everything.amount > 95].groupby("user").agg(big=("amount", "size"))
    got = latest_per_key(read_output(tmp_path / "out"), "user")
    pd.testing.assert_frame_equal(got[["big"]], expected, check_dtype=False)


@pytest.mark.jvm
def test_min_max_follow_spark_for_nan_timestamps_and_booleans(spark, tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    rng = np.random.default_rng(3)
    parts = []
    for number in range(3):
        rows = 60
        part = pd.DataFrame(
            {
                "k": rng.choice(["a", "b", "c"], rows),
                "x": np.where(rng.random(rows) < 0.05, np.nan, rng.normal(size=rows)),
                "ts": pd.Timestamp("2026-11-01", tz="UTC") + pd.to_timedelta(rng.integers(0, 10**6, rows), unit="s"),
                "flag": rng.random(rows) < 0.5,
            }
        )
        part.to_parquet(incoming / f"p{number}.parquet", index=False, coerce_timestamps="us")
        parts.append(part)
    aggregates = {"hi": "max(x)", "lo": "min(x)", "last": "max(ts)", "first": "min(ts)", "any": "max(flag)",
                  "all": "min(flag)"}  # fmt: skip
    stream = Pipeline(config=config(2))
    source = files(incoming, schema="k string, x double, ts timestamp, flag boolean", watch=True,
                   maxFilesPerTrigger="1")  # fmt: skip
    stream.source(source).key_by("k").aggregate(**aggregates).sink(parquet(tmp_path / "out"))
    assert len(stream.run(checkpoint=str(tmp_path / "ckpt"), available_now=True).batches) == 3

    batch = Pipeline(config=config(2))  # Spark's own aggregation of all rows is the reference
    expected = batch.source(files(incoming)).key_by("k").aggregate(**aggregates).to_pandas().set_index("k")
    got = latest_per_key(read_output(tmp_path / "out"), "k")
    pd.testing.assert_frame_equal(got[list(aggregates)], expected.sort_index()[list(aggregates)], check_dtype=False)


@pytest.mark.jvm
def test_log_takes_types_spark_reads(spark, tmp_path: Path) -> None:
    schema = pa.schema([("user", pa.large_string()), ("at", pa.timestamp("s")), ("n", pa.uint32())])
    target = Log.create(tmp_path / "log", 2, schema)
    assert target.schema == pa.schema([("user", pa.string()), ("at", pa.timestamp("us")), ("n", pa.int64())])
    records = pa.table(
        {"user": ["a", "b"], "at": pa.array([0, 86_400], pa.timestamp("s")), "n": pa.array([1, 2], pa.uint32())}
    )
    target.append(records.cast(schema))
    p = Pipeline(config=config(1))
    p.source(log(str(tmp_path / "log"))).key_by("user").aggregate(last="max(at)", n="sum(n)").sink(
        parquet(tmp_path / "out")
    )
    p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    got = read_output(tmp_path / "out").sort_values("user")
    assert got.n.tolist() == [1, 2]
    assert got["last"].tolist() == [pd.Timestamp("1970-01-01"), pd.Timestamp("1970-01-02")]
    with pytest.raises(PlanError, match=r"column 'big' is uint64, which Spark cannot hold"):
        Log.create(tmp_path / "log2", 1, pa.schema([("big", pa.uint64())]))
    with pytest.raises(PlanError, match=r"key column\(s\) \['usr'\] are not in the log's columns"):
        target.append(records.cast(schema), key="usr")


def test_concurrent_appends_keep_every_record(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    target = Log.create(tmp_path / "log", 2, EVENTS)
    chunks = [events(100, 10, start=i * 100, seed=i) for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda chunk: Log(tmp_path / "log").append(pa.Table.from_pandas(chunk, schema=EVENTS)), chunks))
    seqs = []
    for split, end in enumerate(target.end_offsets()):
        seqs += pa.Table.from_batches(list(target.read(split, 0, end)), schema=EVENTS).column("seq").to_pylist()
    assert sorted(seqs) == list(range(800))


def test_log_read_limit_and_truncation(tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from keyflow.connectors.streams import LogReader

    append(tmp_path / "log", events(1_000, 50, start=0, seed=4), splits=4)
    reader = LogReader({"path": str(tmp_path / "log"), "partitions": "2"})
    start = reader.initialOffset()
    for limit in (1, 3, 250, 999):
        end = reader.latestOffset(start, ReadMaxRows(limit))
        assert sum(end[s] - start[s] for s in end) == limit
    with pytest.raises(ValueError, match=r"has fewer records than already read .* recreated or truncated"):
        reader.latestOffset(dict.fromkeys(start, 10**6), ReadMaxRows(10))
