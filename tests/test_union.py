"""``union``: the rows of several streams in one, batch and streaming. Streaming reads several
unbounded sources in one query (each micro-batch holds rows of all of them), so keyed state,
watermarks (the smallest of the inputs') and restarts at another parallelism cover both.
Answers come from pandas over the same rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from keyflow import Log, Pipeline, WatermarkStrategy, files, parquet, tumbling
from keyflow.connectors.streams import log
from keyflow.errors import PlanError, RestoreError
from keyflow.plan.builder import Keying
from keyflow.state.checkpoint import Checkpoint
from tests.event_time import TIMED, append_timed, expected_tumbling, normalized, timed_events
from tests.streams import append, config, events, expected_counts, latest_counts, read_output, write_files

STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness("ts", "30 s")


@pytest.mark.jvm
def test_union_of_two_file_sources_and_of_two_branches_equals_pandas(tmp_path: Path) -> None:
    a, b = events(900, 40, start=0, seed=1), events(700, 60, start=10_000, seed=2)
    write_files(tmp_path / "a", a)
    write_files(tmp_path / "b", b)
    p = Pipeline(config=config(2))
    first, second = p.source(files(str(tmp_path / "a"))), p.source(files(str(tmp_path / "b")))
    both = first.union(second)
    both.key_by("user").aggregate(events="count(*)", amount="sum(amount)").sink(parquet(tmp_path / "counts"))
    branches = first.filter("amount < 0").union(first.filter("amount >= 0"), second).set_parallelism(3)
    branches.sink(parquet(tmp_path / "rows"), parallelism=3)
    p.run()
    expected = expected_counts(pd.concat([a, b]))
    got = read_output(tmp_path / "counts").sort_values("user").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    rows = read_output(tmp_path / "rows").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows[a.columns], pd.concat([a, b]).sort_values("seq").reset_index(drop=True))
    assert len(list((tmp_path / "rows").glob("part-*"))) == 3  # the union and its sink at parallelism 3


def test_union_mistakes_are_plan_errors_naming_the_streams_and_columns(tmp_path: Path) -> None:
    append(tmp_path / "a", events(3, 2, start=0, seed=1))
    other = pa.schema([("user", pa.string()), ("amount", pa.string()), ("seq", pa.int64())])
    Log.create(tmp_path / "b", 2, other)
    Log.create(tmp_path / "c", 2, pa.schema([("user", pa.string()), ("n", pa.int64())]))
    p = Pipeline()
    a = p.source(log(str(tmp_path / "a")), name="a")
    with pytest.raises(PlanError, match=r"'a' and 'b' have columns of different types: amount \(numeric vs string\)"):
        a.union(p.source(log(str(tmp_path / "b")), name="b"))
    with pytest.raises(PlanError, match=r"only 'a' has \['amount', 'seq'\], only 'c' has \['n'\]; select or rename"):
        a.union(p.source(log(str(tmp_path / "c")), name="c"))
    with pytest.raises(PlanError, match="union\\(\\.\\.\\.\\) of a stream with itself"):
        a.union(a)
    with pytest.raises(PlanError, match="union\\(\\.\\.\\.\\) needs one or more other streams"):
        a.union()
    with pytest.raises(PlanError, match="of a stream of another pipeline"):
        a.union(Pipeline().source(log(str(tmp_path / "a"))))
    changelog = a.key_by("user").aggregate(n="count(*)").select("user", "n AS amount", "n AS seq")
    assert not changelog.is_changelog  # key_by's aggregate emits each changed key's row, no row kinds
    sql_like = p.builder.aggregate(a.node_id, Keying(("user",)), {"amount": "sum(amount)"}, emit_changelog=True)
    with pytest.raises(PlanError, match=r"union\(\.\.\.\) of a changelog .* is not supported yet: a union"):
        p.builder.union([sql_like, a.select("user", "amount", "'+I' AS op").node_id])


@pytest.mark.jvm
def test_streaming_union_of_two_logs_with_restart_at_another_parallelism(tmp_path: Path) -> None:
    """Two unbounded sources in one query: each micro-batch holds rows of both; the state and
    both sources' offsets commit together, and a restart at parallelism 3 continues them."""
    a1, b1 = events(1_200, 50, start=0, seed=3), events(800, 70, start=100_000, seed=4)
    append(tmp_path / "a", a1)
    append(tmp_path / "b", b1, splits=2)

    def pipeline(parallelism: int) -> Pipeline:
        p = Pipeline(config=config(parallelism))
        a = p.source(log(str(tmp_path / "a"), rows_per_batch=500), uid="a")
        b = p.source(log(str(tmp_path / "b"), rows_per_batch=300), uid="b")
        counts = a.union(b).key_by("user").aggregate(events="count(*)", amount="sum(amount)")
        counts.sink(parquet(tmp_path / "counts"))
        return p

    first = pipeline(2).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert sum(batch.input_rows or 0 for batch in first.batches) == 2_000
    pd.testing.assert_frame_equal(latest_counts(tmp_path / "counts"), expected_counts(pd.concat([a1, b1])),
                                  check_dtype=False)  # fmt: skip
    a2, b2 = events(600, 50, start=200_000, seed=5), events(900, 90, start=300_000, seed=6)
    append(tmp_path / "a", a2)
    append(tmp_path / "b", b2, splits=2)
    second = pipeline(3).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert {batch.parallelism for batch in second.batches} == {3}
    everything = pd.concat([a1, b1, a2, b2])
    pd.testing.assert_frame_equal(latest_counts(tmp_path / "counts"), expected_counts(everything), check_dtype=False)
    fewer = Pipeline(config=config(2))
    counted = fewer.source(log(str(tmp_path / "a")), uid="a").key_by("user")
    counted.aggregate(events="count(*)", amount="sum(amount)").sink(parquet(tmp_path / "counts"))
    with pytest.raises(RestoreError, match=r"now reads sources \['a'\] \(uids\) but .* was started with \['a', 'b'\]"):
        fewer.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)


def test_a_window_after_a_union_names_each_inputs_event_time_column(tmp_path: Path) -> None:
    for name in ("timed", "plain"):
        Log.create(tmp_path / name, 2, TIMED)
    p = Pipeline()
    timed = p.source(log(str(tmp_path / "timed")), watermark=STRATEGY, name="timed")
    both = timed.union(p.source(log(str(tmp_path / "plain")), name="plain"))
    with pytest.raises(PlanError, match=r"its inputs' event-time columns are \{'timed': 'ts', 'plain': None\}"):
        both.key_by("user").window(tumbling("10 min"))


def test_sources_of_one_name_without_uids_cannot_stream_together(tmp_path: Path) -> None:
    """Their derived uids follow creation order: swapping them would swap offsets and watermarks."""
    append(tmp_path / "a", events(10, 2, start=0, seed=1))
    append(tmp_path / "b", events(10, 2, start=0, seed=2))
    p = Pipeline(config=config(1))
    p.source(log(str(tmp_path / "a"))).union(p.source(log(str(tmp_path / "b")))).sink(parquet(tmp_path / "o"))
    with pytest.raises(PlanError, match=r"sources \['source: log'\] have the same name and no uid.*uid='orders'"):
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_streaming_union_windows_fire_at_the_smallest_watermark_of_the_sources(tmp_path: Path) -> None:
    """Flink's rule for an operator with several inputs: its watermark is their minimum, so a
    source whose event time lags holds the union's windows back; each source's watermark is
    committed under its uid."""
    ahead = timed_events(800, 20, start=0, seed=7, seconds=3_600)
    behind = timed_events(400, 20, start=0, seed=8, seconds=1_200)  # event time ends 40 min earlier
    append_timed(tmp_path / "ahead", ahead)
    append_timed(tmp_path / "behind", behind, splits=2)
    p = Pipeline(config=config(2))
    a = p.source(log(str(tmp_path / "ahead")), watermark=STRATEGY, uid="ahead")
    b = p.source(log(str(tmp_path / "behind")), watermark=STRATEGY, uid="behind")
    windows = a.union(b).key_by("user").window(tumbling("10 min")).aggregate(n="count(*)", total="sum(amount)")
    windows.sink(parquet(tmp_path / "windows"))
    result = p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    marks = Checkpoint(str(tmp_path / "ckpt")).manifests.latest().watermarks  # type: ignore[union-attr]
    assert set(marks) == {"ahead", "behind"}
    smallest = min(mark["watermark"] for mark in marks.values())
    assert smallest == marks["behind"]["watermark"] < marks["ahead"]["watermark"]
    assert result.batches[-1].watermark == smallest
    expected = normalized(expected_tumbling(pd.concat([ahead, behind]), smallest), ["user", "window_start"])
    got = normalized(read_output(tmp_path / "windows"), ["user", "window_start"])
    pd.testing.assert_frame_equal(got[["user", "window_start", "n", "total"]], expected, check_dtype=False)
    assert len(expected) < len(expected_tumbling(pd.concat([ahead, behind])))  # the lagging source held some back
