"""The adaptive scheduler on a real Spark standalone cluster (master and workers started here,
on loopback): a second worker raises the parallelism after the cooldown, a lost worker lowers
it after the stabilization timeout, the output equals pandas' answer (no state lost), and
with no worker left the job fails after the resource-wait timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from keyflow.runtime.standalone import StandaloneCluster
from keyflow.state.checkpoint import Checkpoint
from tests.streams import append, events, expected_totals, read_output

pytestmark = pytest.mark.jvm  # every test here runs Spark

ROOT = Path(__file__).resolve().parents[1]
COOLDOWN, STABILIZATION = 40.0, 4.0  # as set in tests/jobs/autoscale.py


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    started = StandaloneCluster(tmp_path / "cluster")
    try:
        yield started
    finally:
        started.close()


class Appender(threading.Thread):
    """Appends 100 events every 0.3 s to the log, as a live source would."""

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log, self.written, self.stopped = log, [], threading.Event()

    def run(self) -> None:
        seq = 0
        while not self.stopped.wait(0.3):
            chunk = events(100, 50, start=seq, seed=seq)
            append(self.log, chunk)
            self.written.append(chunk)
            seq += len(chunk)

    def all(self) -> pd.DataFrame:
        self.stopped.set()
        self.join()
        return pd.concat(self.written, ignore_index=True)


def scheduler_log(checkpoint: Path) -> list[dict[str, Any]]:
    path = checkpoint / "scheduler.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(what: str, found: Callable[[], Any], job: subprocess.Popen[str], timeout: float = 150) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.poll() is not None:
            raise AssertionError(f"the job ended (exit {job.returncode}) while waiting for {what}")
        result = found()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s")


def committed_parallelism(checkpoint: Path) -> int | None:
    manifest = Checkpoint(str(checkpoint)).manifests.latest()
    return manifest.parallelism if manifest else None


def rescales(log: list[dict[str, Any]], before: int, after: int) -> list[dict[str, Any]]:
    """Decisions that run the job at ``after`` instead of ``before``."""
    decisions = [r for r in log if r["kind"] == "decision" and r["state"] == "Executing"]
    return [r for r in decisions if (r["from"], r["to"]) == (before, after)]


def test_parallelism_follows_the_workers(tmp_path: Path, cluster: StandaloneCluster) -> None:
    checkpoint = tmp_path / "ckpt"
    cluster.add_worker("worker-1")
    appender = Appender(tmp_path / "log")
    append(tmp_path / "log", events(100, 50, start=10**9, seed=1).iloc[:0])  # an empty log to start from
    appender.start()
    env = {**os.environ, "KEYFLOW_TEST_DIR": str(tmp_path), "KEYFLOW_TEST_MASTER": cluster.url,
           "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
    output = (tmp_path / "job.out").open("w")
    job = subprocess.Popen(
        [sys.executable, "-m", "keyflow", "run", "tests/jobs/autoscale.py", "--checkpoint", str(checkpoint)],
        cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # One worker, one core: the job starts at parallelism 1; a second worker joins during
        # the cooldown that starts then.
        started = wait_for("Executing at parallelism 1", lambda: rescales(scheduler_log(checkpoint), 0, 1), job)[0]
        cluster.add_worker("worker-2")
        wait_for("a batch committed at parallelism 1", lambda: committed_parallelism(checkpoint) == 1, job)
        up = wait_for("a rescale 1 → 2", lambda: rescales(scheduler_log(checkpoint), 1, 2), job)[0]
        log = scheduler_log(checkpoint)
        arrived = next(r for r in log if r["kind"] == "resources" and r["slots"] == 2)
        assert arrived["time"] - started["time"] < COOLDOWN, "worker-2 came after the cooldown: the test is too slow"
        # New slots during a cooldown wait for the check scheduled at its end (Flink's rule):
        # the rescale starts a cooldown after the job started, not after the slots, and goes
        # through Restarting → WaitingForResources (2 slots are sufficient, not desired).
        scheduled = next(r for r in log if r["kind"] == "decision" and r["due"] is not None)
        assert scheduled["time"] == pytest.approx(arrived["time"], abs=0.01)
        assert scheduled["due"] == pytest.approx(started["time"] + COOLDOWN, abs=0.01)
        restarted = next(r for r in log if r["kind"] == "decision" and r["state"] == "Restarting")
        assert restarted["time"] == pytest.approx(scheduled["due"], abs=0.01)
        assert up["time"] == pytest.approx(scheduled["due"] + STABILIZATION, abs=0.01)
        wait_for("a batch committed at parallelism 2", lambda: committed_parallelism(checkpoint) == 2, job)

        cluster.stop_worker("worker-1")
        down = wait_for("a rescale 2 → 1", lambda: rescales(scheduler_log(checkpoint), 2, 1), job)[0]
        log = scheduler_log(checkpoint)
        lost = next(r for r in log if r["kind"] == "resources" and r["lost"] and r["time"] > up["time"])
        states = [r["state"] for r in log if r["kind"] == "decision" and lost["time"] <= r["time"] <= down["time"]]
        assert states == ["Restarting", "WaitingForResources", "Executing"], states
        assert down["time"] - lost["time"] >= STABILIZATION - 0.01
        wait_for("a batch committed at parallelism 1", lambda: committed_parallelism(checkpoint) == 1, job)

        data = appender.all()
        wait_for("every event in the output", lambda: len(read_output(tmp_path / "out")) >= len(data), job)
        # The last worker goes: no slot for resource-wait-timeout (12 s) and the job fails, saying so.
        cluster.stop_worker("worker-2")
        assert job.wait(timeout=120) == 2  # keyflow's error exit
    finally:
        appender.stopped.set()
        if job.poll() is None:
            job.kill()
        output.close()
        job_output = (tmp_path / "job.out").read_text()
        print(job_output[-5000:])

    assert "no executor cores when the resource-wait-timeout (12 s, jobmanager.adaptive-scheduler" in job_output
    states = [r["state"] for r in scheduler_log(checkpoint) if r["kind"] == "decision"][-3:]
    assert states == ["Restarting", "WaitingForResources", "Finished"]
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)
    history = [(e["from"], e["to"]) for e in Checkpoint(str(checkpoint)).events()]
    assert history == [(1, 2), (2, 1)]
