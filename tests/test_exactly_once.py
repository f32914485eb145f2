"""Exactly-once under real crashes: the driver is killed with SIGKILL inside a micro-batch,
restarted, and the output must equal that of a run that never crashed: running totals (to
files and, in Kafka transactions, to a topic a read_committed consumer reads), with event
time session windows and timers open across the crashes, and a full outer join with a
second source, a Kafka topic, whose state holds unmatched rows of both sides across them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from keyflow.changelog import current
from keyflow.cli.app import app
from keyflow.runtime.kafka_broker import LocalBroker
from keyflow.runtime.streaming import FAULT_ENV
from keyflow.state.checkpoint import Checkpoint
from tests.event_time import append_timed, assert_event_time_output, timed_events
from tests.kafka import produce, read_topic, values_frame
from tests.streams import expected_totals, read_output

pytestmark = pytest.mark.jvm  # every test here runs Spark

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "running_totals.py"


def run_job(tmp: Path, parallelism: int, servers: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEYFLOW_TEST_DIR": str(tmp), "PYTHONPATH": str(ROOT), "KEYFLOW_TEST_KAFKA": servers}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "keyflow", "run", str(JOB), "-p", str(parallelism)]
    command += ["--checkpoint", str(tmp / "ckpt"), "--available-now"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


POINTS = ["start", "after-sink-write", "after-commit", "after-publish"]
SEED = random.randrange(1_000_000)


def crashes(seed: int) -> list[tuple[str, int]]:
    """Four crashes on one checkpoint, one in each of batches 1..4, each at another of the crash
    points in a random order, each run at another parallelism than the one before: every
    restart recovers from the crash before it and then crashes at the next."""
    rng = random.Random(seed)
    points = list(POINTS)
    rng.shuffle(points)
    return [(f"{point}:{batch}", 2 + batch % 2) for batch, point in enumerate(points, start=1)]


def test_killed_driver_restarts_to_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kafka_broker: LocalBroker
) -> None:
    data = timed_events(4_200, 200, start=0, seed=5, seconds=4_200)  # 700 rows per batch: batches 0..5
    append_timed(tmp_path / "log", data)
    rng = np.random.default_rng(6)
    visits = pd.DataFrame({"uid": [f"u{n}" for n in rng.integers(100, 300, 1_500)], "visit": np.arange(1_500)})
    servers = kafka_broker.bootstrap_servers
    kafka_broker.create_topic("crash_visits", 2)
    kafka_broker.create_topic("crash_totals", 2)
    produce(servers, "crash_visits", visits, key="uid")
    for fault, parallelism in crashes(SEED):
        crashed = run_job(tmp_path, parallelism, servers, fault)
        assert crashed.returncode == -signal.SIGKILL, f"seed {SEED}, {fault}: {crashed.stdout}{crashed.stderr}"
    monkeypatch.setenv("KEYFLOW_TEST_DIR", str(tmp_path))
    monkeypatch.setenv("KEYFLOW_TEST_KAFKA", servers)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    resumed = CliRunner().invoke(
        app, ["run", str(JOB), "-p", "1", "--checkpoint", str(tmp_path / "ckpt"), "--available-now"]
    )
    assert resumed.exit_code == 0, resumed.output  # the last restart runs in this process: no fault left to inject
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)
    in_kafka = values_frame(read_topic(servers, "crash_totals")).sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(in_kafka, expected_totals(data).reset_index(drop=True), check_dtype=False)
    watermark = Checkpoint(str(tmp_path / "ckpt")).manifests.latest().watermarks  # type: ignore[union-attr]
    final_watermark = next(iter(watermark.values()))["watermark"]
    assert_event_time_output(tmp_path / "event_time", data, final_watermark, tumbling_windows=False)
    assert not list((tmp_path / "out" / "_keyflow_staging").rglob("part-*"))  # nothing left half-published
    joined = current(pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "joined").glob("part-*"))]))
    reference = data.merge(visits, left_on="user", right_on="uid", how="outer")
    reference["user"] = reference["user"].fillna(reference["uid"])
    columns = ["user", "seq", "visit"]
    pd.testing.assert_frame_equal(
        joined.to_pandas()[columns]
        .astype({"seq": "Int64", "visit": "Int64"})
        .sort_values(columns)
        .reset_index(drop=True),
        reference[columns].astype({"seq": "Int64", "visit": "Int64"}).sort_values(columns).reset_index(drop=True),
    )
