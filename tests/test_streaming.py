"""Streaming pipelines on a real local Spark: durable keyed state, restarts and rescaling."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from keyflow import Log, Pipeline, log, parquet
from keyflow.state.checkpoint import Checkpoint
from tests.streams import (
    EVENTS,
    TOTAL_SCHEMA,
    TOTAL_STATE,
    append,
    config,
    events,
    expected_totals,
    read_output,
    running_total,
)

pytestmark = pytest.mark.jvm  # every test here runs Spark


def totals_pipeline(tmp: Path, parallelism: int, **extra: object) -> Pipeline:
    pipeline = Pipeline(config=config(parallelism, **extra))
    stream = pipeline.source(log(str(tmp / "log"), rows_per_batch=700))
    stream.key_by("user").process(
        running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq", name="running_total"
    ).sink(parquet(tmp / "out"))
    return pipeline


def assert_totals(tmp: Path, all_events: pd.DataFrame) -> None:
    got = read_output(tmp / "out").sort_values("seq").reset_index(drop=True)
    expected = expected_totals(all_events).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


@pytest.mark.smoke  # the one pipeline of the fast lane (make check)
def test_restart_at_another_parallelism_continues_the_state(spark, tmp_path: Path) -> None:
    first = events(2_000, 150, start=0, seed=1)
    append(tmp_path / "log", first)
    result = totals_pipeline(tmp_path, 2).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert len(result.batches) >= 2  # rows_per_batch splits the backlog into several micro-batches
    assert_totals(tmp_path, first)

    second = events(1_500, 150, start=2_000, seed=2)
    append(tmp_path / "log", second)
    totals_pipeline(tmp_path, 3).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert_totals(tmp_path, pd.concat([first, second]))

    events_log = Checkpoint(str(tmp_path / "ckpt")).events()
    assert [(e["from"], e["to"], e["reason"]) for e in events_log] == [(2, 3, "restart")]


def test_live_rescale_keeps_state_and_rewrites_no_state_file(spark, tmp_path: Path) -> None:
    batches = [events(1_000, 120, start=i * 1_000, seed=10 + i) for i in range(3)]
    append(tmp_path / "log", batches[0])
    pipeline = totals_pipeline(tmp_path, 2, **{"state.checkpoints.num-retained": 100})
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    job = pipeline.start(checkpoint=str(tmp_path / "ckpt"))
    try:
        job.process_all_available()
        before = _state_files(tmp_path / "ckpt")
        job.rescale(4, reason="test")
        append(tmp_path / "log", batches[1])
        job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 4
        job.rescale(1, reason="test")
        append(tmp_path / "log", batches[2])
        job.process_all_available()
        assert job.status == "running"
    finally:
        job.stop()
    after = _state_files(tmp_path / "ckpt")
    assert {path: after[path] for path in before} == before  # every file of before the rescale, unchanged
    parallelisms = [checkpoint.manifests.read(v).parallelism for v in checkpoint.manifests.versions()]
    assert parallelisms[0] == 2
    assert 4 in parallelisms
    assert parallelisms[-1] == 1
    assert [(e["from"], e["to"]) for e in checkpoint.events()] == [(2, 4), (4, 1)]
    assert_totals(tmp_path, pd.concat(batches))


def _state_files(checkpoint: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(checkpoint)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (checkpoint / "state").rglob("*.parquet")
    }


def test_rescale_above_max_parallelism_is_refused(spark, tmp_path: Path) -> None:
    append(tmp_path / "log", events(100, 10, start=0, seed=3))
    job = totals_pipeline(tmp_path, 2, **{"pipeline.max-parallelism": 8}).start(checkpoint=str(tmp_path / "ckpt"))
    try:
        with pytest.raises(Exception, match=r"rescale\(9\) is above the checkpoint's max parallelism 8"):
            job.rescale(9)
    finally:
        job.stop()


def test_rows_with_null_keys_go_to_the_dead_letter_sink_exactly_once(spark, tmp_path: Path) -> None:
    """A streaming dead-letter sink is staged and published with the micro-batch, like any sink."""
    history = events(1_200, 40, start=0, seed=7)
    history.loc[history.index % 7 == 0, "user"] = None
    log_of_events = Log.create(tmp_path / "log", 3, EVENTS)  # round robin: a null key has no split
    log_of_events.append(pa.Table.from_pandas(history, schema=EVENTS, preserve_index=False))
    pipeline = Pipeline(config=config(2))
    stream = pipeline.source(log(str(tmp_path / "log"), rows_per_batch=500))
    counts = stream.key_by("user", on_null=parquet(tmp_path / "dead")).aggregate(n="count(*)", total="sum(amount)")
    counts.sink(parquet(tmp_path / "out"))
    result = pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    dead = read_output(tmp_path / "dead").sort_values("seq").reset_index(drop=True)
    expected_dead = history[history["user"].isna()].reset_index(drop=True)
    pd.testing.assert_frame_equal(dead, expected_dead, check_dtype=False)
    latest = read_output(tmp_path / "out").groupby("user").agg(n=("n", "max"), total=("total", "last"))
    keyed = history.dropna(subset=["user"]).groupby("user").agg(n=("amount", "size"), total=("amount", "sum"))
    assert latest["n"].to_dict() == keyed["n"].to_dict()
    assert latest["total"].to_dict() == keyed["total"].to_dict()  # files in batch order: last = final
    assert sum(rows for name, rows in result.output_rows.items() if name.startswith("dead letters")) == len(dead)
