"""Helpers for streaming tests: a log of events written with pandas, and expected answers."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from keyflow import KeyedBatch, KeyedState, Log, Pipeline, ValueState, log, parquet
from tests.pipelines import TEST_SPARK

EVENTS = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("seq", pa.int64())])


def events(rows: int, users: int, start: int, seed: int) -> pd.DataFrame:
    """Events with a global sequence number ``seq`` (so expected answers know the order)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user": [f"u{n}" for n in rng.integers(0, users, rows)],
            "amount": rng.integers(-50, 100, rows),
            "seq": np.arange(start, start + rows, dtype=np.int64),
        }
    )


def append(log_path: Path, frame: pd.DataFrame, splits: int = 3, schema: pa.Schema = EVENTS, key: str = "user") -> None:
    """Append ``frame`` to the log (created with ``splits`` and ``schema`` if new), split by ``key``."""
    try:
        log = Log(log_path)
    except Exception:
        log = Log.create(log_path, splits, schema)
    log.append(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), key=key)


def write_files(directory: Path, frame: pd.DataFrame, schema: pa.Schema = EVENTS) -> None:
    """``frame`` as the one Parquet file of a new directory (a bounded files(...) source)."""
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), directory / "part.parquet")


def write_parts(directory: Path, parts: Iterable[pd.DataFrame], first: int = 0) -> None:
    """Each frame as the next Parquet file ``part-N`` (from ``first``) of a directory, each file
    modified a second after the one before: a watched source reads files in modification order
    (Spark's FileStreamSource), and files written within one clock tick would come in any order."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, part in enumerate(parts, start=first):
        path = directory / f"part-{number}.parquet"
        part.to_parquet(path, index=False)
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))


def run_restarted(
    script: str, directory: Path, parts: list[pd.DataFrame], checkpoint: Path, config: dict[str, object]
) -> None:
    """A SQL ``script`` over a watched ``directory``: all ``parts`` but the last read at
    parallelism 2, then a restart at 3 that reads the last (one micro-batch per part)."""
    write_parts(directory, parts[:-1])
    for parallelism in (2, 3):
        if parallelism == 3:
            write_parts(directory, parts[-1:], first=len(parts) - 1)
        pipeline = Pipeline(parallelism=parallelism, config=config)
        pipeline.sql(script)
        result = pipeline.run(checkpoint=str(checkpoint), available_now=True)
        assert [batch.parallelism for batch in result.batches] == [parallelism] * (
            len(parts) - 1 if parallelism == 2 else 1
        )


def split(frame: pd.DataFrame, parts: int) -> list[pd.DataFrame]:
    """``frame`` cut into ``parts`` consecutive slices of (nearly) equal size."""
    size = -(-len(frame) // parts)
    return [frame.iloc[start : start + size] for start in range(0, len(frame), size)]


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Per user: the running total after each event (events ordered by seq)."""
    total = state["total"]
    running = batch.running_sum(batch.data.column("amount"), total.get())
    total.update(batch.last_per_key(running))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "total": running})


TOTAL_STATE = {"total": ValueState("int64")}
TOTAL_SCHEMA = "user string, seq long, total long"


def config(parallelism: int, **extra: object) -> dict[str, object]:
    return {**TEST_SPARK, "parallelism.default": parallelism, "execution.checkpointing.interval": "0 s", **extra}


def expected_totals(all_events: pd.DataFrame) -> pd.DataFrame:
    ordered = all_events.sort_values("seq")
    return ordered.assign(total=ordered.groupby("user")["amount"].cumsum())[["user", "seq", "total"]]


def read_output(path: Path) -> pd.DataFrame:
    """All committed output files of a sink (staging is skipped: it starts with '_')."""
    files = sorted(p for p in path.glob("part-*") if p.is_file())
    if not files:
        return pd.DataFrame()
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def totals_and_counts(base: Path | str, parallelism: int = 2) -> Pipeline:
    """Two kinds of state on one log: per-event running totals (``process``) into
    ``base/totals`` and a per-user count and sum (``aggregate``) into ``base/counts``; full
    and delta state files both exist after a few micro-batches."""
    pipeline = Pipeline(config=config(parallelism, **{"state.compaction.max-deltas": 2}))
    events = pipeline.source(log(f"{base}/log", rows_per_batch=500))
    by_user = events.key_by("user")
    by_user.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(parquet(f"{base}/totals"))
    by_user.aggregate(events="count(*)", amount="sum(amount)").sink(parquet(f"{base}/counts"))
    return pipeline


def latest_counts(path: Path) -> pd.DataFrame:
    """An aggregate's current result from its committed output: each user's newest row
    (files are named by micro-batch, so later files hold newer rows)."""
    files = sorted(p for p in path.glob("part-*") if p.is_file())
    rows = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    return rows.drop_duplicates("user", keep="last").sort_values("user").reset_index(drop=True)


def expected_counts(all_events: pd.DataFrame) -> pd.DataFrame:
    grouped = all_events.groupby("user").agg(events=("amount", "size"), amount=("amount", "sum"))
    return grouped.reset_index().sort_values("user").reset_index(drop=True)
