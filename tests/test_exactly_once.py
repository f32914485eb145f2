"""Exactly-once under real crashes: the driver is killed with SIGKILL inside a micro-batch,
restarted, and the output must equal that of a run that never crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from keyflow.cli.app import app
from keyflow.runtime.streaming import FAULT_ENV
from tests.streams import append, events, expected_totals, read_output

pytestmark = pytest.mark.jvm  # every test here runs Spark

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "running_totals.py"


def run_job(tmp: Path, parallelism: int, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEYFLOW_TEST_DIR": str(tmp), "PYTHONPATH": str(ROOT)}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "keyflow", "run", str(JOB), "-p", str(parallelism)]
    command += ["--checkpoint", str(tmp / "ckpt"), "--available-now"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


# Each crash point in turn, on one checkpoint: every restart recovers from the crash before it
# (at another parallelism) and then crashes at the next point.
CRASHES = [("start:1", 2), ("after-sink-write:2", 3), ("after-commit:3", 2), ("after-publish:4", 3)]


def test_killed_driver_restarts_to_the_same_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = events(4_200, 200, start=0, seed=5)  # 700 rows per batch: batches 0..5
    append(tmp_path / "log", data)
    for fault, parallelism in CRASHES:
        crashed = run_job(tmp_path, parallelism, fault)
        assert crashed.returncode == -signal.SIGKILL, f"{fault}: {crashed.stdout}{crashed.stderr}"
    monkeypatch.setenv("KEYFLOW_TEST_DIR", str(tmp_path))
    monkeypatch.delenv(FAULT_ENV, raising=False)
    resumed = CliRunner().invoke(
        app, ["run", str(JOB), "-p", "1", "--checkpoint", str(tmp_path / "ckpt"), "--available-now"]
    )
    assert resumed.exit_code == 0, resumed.output  # the last restart runs in this process: no fault left to inject
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)
    assert not list((tmp_path / "out" / "_keyflow_staging").rglob("part-*"))  # nothing left half-published
