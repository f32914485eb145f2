"""Partitioned file sinks (``PARTITIONED BY``) and Flink's partition commit: rows under
Hive-style directories equal to pandas' answer, bounded and streamed; a partition's
``_SUCCESS`` file appears when its trigger says (Flink's ProcTimeCommitTrigger,
PartitionTimeCommitTrigger, DefaultPartTimeExtractor), and pending partitions survive a restart."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from keyflow import Pipeline
from keyflow.connectors.files import FileSink
from keyflow.connectors.partition_commit import PartitionCommit
from keyflow.errors import DataError
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import split, write_parts

MINUTE = 60_000_000
T0 = int(pd.Timestamp("2026-03-01 12:00", tz="UTC").value // 1_000)  # µs
P0, P1 = "dt=2026-03-01/hm=12%3A00", "dt=2026-03-01/hm=12%3A01"
BY_TIME = PartitionCommit(("dt", "hm"), "partition-time", MINUTE, timestamp_pattern="$dt $hm:00")


def test_process_time_commits_at_once_without_a_delay() -> None:
    commit, pending = PartitionCommit(("dt",)).due([], [P0, P1], None, now=5, end_of_input=False)
    assert (commit, pending) == ([P0, P1], [])


def test_process_time_with_a_delay_commits_once_it_has_passed_since_creation() -> None:
    """ProcTimeCommitPredicate: ``now > created + delay``; created when first written."""
    trigger = PartitionCommit(("dt",), delay=10)
    commit, pending = trigger.due([], [P0], None, now=100, end_of_input=False)
    assert (commit, pending) == ([], [{"partition": P0, "created": 100}])
    commit, pending = trigger.due(pending, [P0, P1], None, now=110, end_of_input=False)  # written again: same age
    assert commit == []
    assert pending == [{"partition": P0, "created": 100}, {"partition": P1, "created": 110}]
    commit, pending = trigger.due(pending, [], None, now=111, end_of_input=False)
    assert (commit, pending) == ([P0], [{"partition": P1, "created": 110}])


def test_partition_time_commits_once_the_watermark_is_past_its_time_and_the_delay() -> None:
    """PartitionTimeCommitPredicate: ``watermark > partition time + delay``, strictly."""
    due = BY_TIME.partition_time(P0) + MINUTE
    assert BY_TIME.partition_time(P0) == T0
    both = [{"partition": P0, "created": 0}, {"partition": P1, "created": 0}]
    assert BY_TIME.due([], [P0, P1], due, 0, False) == ([], both)
    assert BY_TIME.due([], [P0, P1], due + 1, 0, False) == ([P0], [{"partition": P1, "created": 0}])
    assert BY_TIME.due([], [P0], None, 0, False) == ([], [{"partition": P0, "created": 0}])  # no watermark yet


def test_loads_pending_partitions_when_restored_and_commits_them_at_the_end_of_input() -> None:
    """Flink's ProcTimeCommitTriggerTest#loadsPendingPartitionsWhenRestored: what a checkpoint
    held as pending commits at the end of a bounded input, whatever the trigger says."""
    restored = [{"partition": P0, "created": 1}, {"partition": P1, "created": 2}]
    assert BY_TIME.due(restored, [], None, 3, end_of_input=True) == ([P0, P1], [])  # type: ignore[arg-type]
    assert BY_TIME.due([], [], None, 3, end_of_input=True) == ([], [])


@pytest.mark.parametrize(
    ("pattern", "zone", "partition", "expected"),
    [
        (None, "UTC", "dt=2026-03-01", "2026-03-01 00:00"),  # no pattern: the first value, a date is midnight
        (None, "UTC", "day=2026-3-1 7%3A05%3A09.25/x=1", "2026-03-01 07:05:09.25"),
        ("$dt $hm:00", "Asia/Tokyo", P1, "2026-03-01 03:01"),  # read in the watermark's time zone
        ("$dt", "UTC", "hm=x/dt=2026-12-31", "2026-12-31"),  # by name, not position
        ("$dt $hm:00", "GMT-08:00", P1, "2026-03-01 20:01"),  # an offset, as Java's ZoneId reads one
        (None, "UTC", "dt=2026-02-30", "2026-03-02"),  # leniently, as Flink's extractor
    ],
)
def test_default_part_time_extractor(pattern: str | None, zone: str, partition: str, expected: str) -> None:
    trigger = PartitionCommit(("dt", "hm"), "partition-time", timestamp_pattern=pattern, time_zone=zone)
    assert trigger.partition_time(partition) == pd.Timestamp(expected, tz="UTC").value // 1_000


def test_a_partition_time_that_is_no_time_names_the_option() -> None:
    with pytest.raises(DataError, match=r"'hm=12%3A00'.*'partition.time-extractor.timestamp-pattern'"):
        PartitionCommit(("hm",), "partition-time").partition_time("hm=12%3A00")
    with pytest.raises(DataError, match=r"hm is null or empty, .* filter those rows \(WHERE hm IS NOT NULL"):
        BY_TIME.partition_time("dt=2026-03-01/hm=__HIVE_DEFAULT_PARTITION__")


def test_a_restore_withdraws_commits_of_partitions_pending_or_emptied(tmp_path: Path) -> None:
    """Restored from an older checkpoint, the files of later batches are gone: a partition
    pending as of the checkpoint, or left without data, loses its success file."""
    for partition, data in (("dt=a", True), ("dt=b", False), ("dt=c", True)):
        (tmp_path / partition).mkdir()
        (tmp_path / partition / "_SUCCESS").write_text("")
        if data:
            (tmp_path / partition / "part-b0000000000-00000.csv").write_text("x\n1\n")
    FileSink(tmp_path, "csv", {}, ("dt",), PartitionCommit(("dt",))).withdraw_commits(["dt=c"])
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("_SUCCESS")} == {"dt=a/_SUCCESS"}


def clicks(rows: int = 900, seed: int = 4) -> pd.DataFrame:
    """Clicks over six minutes from 11:58, in time order."""
    rng = np.random.default_rng(seed)
    times = pd.Timestamp("2026-03-01 11:58") + pd.to_timedelta(np.sort(rng.integers(0, 360_000, rows)), unit="ms")
    return pd.DataFrame({"user_id": [f"u{n}" for n in rng.integers(0, 9, rows)], "amount": rng.integers(1, 50, rows),
                         "ts": times.astype("M8[us]")})  # fmt: skip


SOURCE = """CREATE TABLE clicks (user_id STRING, amount BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet'{watch});
"""
SINK = """CREATE TABLE out (user_id STRING, amount BIGINT, ts TIMESTAMP(3), dt STRING, hm STRING)
PARTITIONED BY (dt, hm) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = '{format}'{commit});
INSERT INTO out SELECT user_id, amount, ts, DATE_FORMAT(ts, 'yyyy-MM-dd'), DATE_FORMAT(ts, 'HH:mm') FROM clicks;
"""
BY_PARTITION_TIME = (", 'sink.partition-commit.trigger' = 'partition-time', 'sink.partition-commit.delay' = '1 min', "
                     "'sink.partition-commit.policy.kind' = 'success-file', "
                     "'partition.time-extractor.timestamp-pattern' = '$dt $hm:00'")  # fmt: skip
CONFIG = {**TEST_SPARK, "spark.sql.session.timeZone": "UTC", "execution.checkpointing.interval": "0 s"}


def expected_rows(frame: pd.DataFrame, zone: str = "UTC") -> pd.DataFrame:
    """pandas' answer: each click (its time in UTC) with its day and minute in ``zone``."""
    local = frame["ts"].dt.tz_localize("UTC").dt.tz_convert(zone)
    return frame.assign(dt=local.dt.strftime("%Y-%m-%d"), hm=local.dt.strftime("%H:%M"))


def read_partitioned(path: Path, format: str) -> pd.DataFrame:
    """The sink's files as pyarrow reads Hive-style directories (values from the names)."""
    frame = ds.dataset(path, format=format, partitioning="hive").to_table().to_pandas()
    frame["ts"] = frame["ts"].dt.tz_convert("UTC").dt.tz_localize(None) if frame["ts"].dt.tz else frame["ts"]
    return frame


def assert_same(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    columns = ["user_id", "amount", "ts", "dt", "hm"]
    got, expected = (
        f[columns].astype({"ts": "M8[us]"}).sort_values(columns, ignore_index=True) for f in (got, expected)
    )
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def partitions(path: Path) -> set[str]:
    return {str(file.parent.relative_to(path)) for file in path.rglob("part-*")}


def committed(path: Path) -> set[str]:
    return {str(file.parent.relative_to(path)) for file in path.rglob("_SUCCESS") if file.parent != path}


@pytest.mark.jvm
@pytest.mark.parametrize(("format", "commit"), [("csv", BY_PARTITION_TIME), ("parquet", "")])
def test_bounded_partitioned_sink_equals_pandas(tmp_path: Path, format: str, commit: str) -> None:
    """A bounded job writes ``dt=…/hm=…`` directories (the partition columns in the names, not the
    files); with a policy, its end commits every partition; without, none gets a success file."""
    frame = clicks()
    write_parts(tmp_path / "in", [frame])
    pipeline = Pipeline(parallelism=2, config=CONFIG)
    pipeline.sql(SOURCE.format(path=tmp_path / "in", watch="")
                 + SINK.format(path=tmp_path / "out", format=format, commit=commit))  # fmt: skip
    pipeline.run()
    assert_same(read_partitioned(tmp_path / "out", format), expected_rows(frame))
    assert len(partitions(tmp_path / "out")) == 6
    assert committed(tmp_path / "out") == (partitions(tmp_path / "out") if commit else set())
    written = next((tmp_path / "out").rglob("part-*"))
    columns = pq.read_schema(written).names if format == "parquet" else written.read_text().splitlines()[0].split(",")
    assert columns == ["user_id", "amount", "ts"]  # the partition values are in the directory names only


@pytest.mark.jvm
@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_streamed_partition_time_commit_across_a_restart(tmp_path: Path, zone: str) -> None:
    """Two micro-batches, then a restart that reads a third file: after each run exactly the
    partitions whose minute plus the 1 min delay the watermark passed hold ``_SUCCESS``; those
    pending at the first run's end are restored from the checkpoint and committed later; the
    rows are pandas' answer, each once. The partitions are named in the session's time zone
    (DATE_FORMAT's), and their times are read in it."""
    frame = clicks()
    parts = split(frame, 3)
    write_parts(tmp_path / "in", parts[:2])
    script = (SOURCE.format(path=tmp_path / "in", watch=", 'source.watch' = 'true', 'source.max-files-per-batch' = '1'")
              + SINK.format(path=tmp_path / "out", format="csv", commit=BY_PARTITION_TIME))  # fmt: skip
    out = tmp_path / "out"
    for run, seen in ((1, parts[:2]), (2, parts)):
        if run == 2:
            write_parts(tmp_path / "in", [parts[2]], first=2)
        pipeline = Pipeline(parallelism=2, config={**CONFIG, "spark.sql.session.timeZone": zone})
        pipeline.sql(script)
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
        rows = pd.concat(seen)
        watermark = (rows["ts"].max() - pd.Timedelta(seconds=5) - pd.Timedelta(microseconds=1)).tz_localize("UTC")
        named = {p: pd.Timestamp(p[3:13] + " " + p[-7:].replace("%3A", ":")).tz_localize(zone) for p in partitions(out)}
        due = {p for p, time in named.items() if watermark > time + pd.Timedelta(minutes=1)}
        assert committed(out) == due, run
        assert due, "nothing committed: the check would prove nothing"
        assert due != partitions(out), "everything committed: the trigger would not be tested"
        assert_same(read_partitioned(out, "csv"), expected_rows(rows, zone))


def sink_error(table: str, tmp_path: Path) -> str:
    insert = "INSERT INTO out SELECT user_id, amount, ts FROM clicks;"
    with pytest.raises(SqlError) as refused:
        Pipeline(parallelism=2, config=TEST_SPARK).sql(f"{SOURCE.format(path=tmp_path, watch='')}{table};\n{insert}")
    return str(refused.value)


FILES = "WITH ('connector' = 'filesystem', 'path' = '/tmp/x', 'format' = 'csv'{})"
COLUMNS = "CREATE TABLE out (user_id STRING, amount BIGINT, ts TIMESTAMP(3)) "


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (COLUMNS + "PARTITIONED BY (region) " + FILES.format(""),
         r"PARTITIONED BY \(region\) \(line 4, column \d+\) names \['region'\], not physical columns of the table "
         r"\['user_id', 'amount', 'ts'\]"),
        (COLUMNS + "PARTITIONED BY (user_id, user_id) " + FILES.format(""), "names a column twice"),
        ("CREATE TABLE out (user_id STRING, amount BIGINT, ts TIMESTAMP(3), _day STRING) PARTITIONED BY (_day) "
         + FILES.format(""), r"names \['_day'\]: directories starting with '_' or '.' are hidden from readers"),
        (COLUMNS + "PARTITIONED BY (user_id, amount, ts) " + FILES.format(""),
         "partitions by every column; leave at least one column in the files"),
        (COLUMNS + "PARTITIONED BY (user_id) WITH ('connector' = 'blackhole')",
         r"PARTITIONED BY \['user_id'\] is for 'filesystem' tables .* connector 'blackhole' has no partitions"),
        (COLUMNS + "PARTITIONED BY (user_id) " + FILES.format(", 'sink.partition-commit.policy.kind' = 'metastore'"),
         "commits partitions with 'success-file' only"),
        (COLUMNS + FILES.format(", 'sink.partition-commit.delay' = '1 min'"),
         r"option\(s\) \['sink.partition-commit.delay'\] commit partitions, and the table has none; declare "
         r"PARTITIONED BY"),
        (COLUMNS + "PARTITIONED BY (user_id) " + FILES.format(
            ", 'sink.partition-commit.policy.kind' = 'success-file', "
            "'partition.time-extractor.timestamp-pattern' = '$dt 00:00:00'"),
         r"names \$dt, not partition keys \['user_id'\]"),
        (COLUMNS + "PARTITIONED BY (user_id) " + FILES.format(
            ", 'sink.partition-commit.policy.kind' = 'success-file', 'sink.partition-commit.trigger' = 'watermark'"),
         "'sink.partition-commit.trigger' = 'watermark' is invalid; choose one of process-time, partition-time"),
        (COLUMNS + "PARTITIONED BY (user_id) " + FILES.format(
            ", 'sink.partition-commit.policy.kind' = 'success-file', "
            "'sink.partition-commit.watermark-time-zone' = 'Mars/Olympus'"), "'Mars/Olympus' is not a time zone"),
        (COLUMNS + "PARTITIONED BY (user_id) " + FILES.format(", 'sink.rolling-policy.rollover-interval' = 'soon'"),
         "'sink.rolling-policy.rollover-interval'='soon' is not a duration"),
    ],
)  # fmt: skip
def test_partitioning_mistakes_are_named_before_spark(tmp_path: Path, table: str, message: str) -> None:
    error = sink_error(table, tmp_path)
    assert re.search(message, error), error
