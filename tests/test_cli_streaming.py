"""``keyflow log``, ``keyflow run --checkpoint`` and ``keyflow checkpoints`` end to end."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from keyflow.cli.app import app
from keyflow.state.checkpoint import Checkpoint
from tests.streams import events, read_output

runner = CliRunner()
KEYFLOW = Path(sys.executable).with_name("keyflow")

PIPELINE_FILE = """
from keyflow import Pipeline, log, parquet

pipeline = Pipeline(config={"spark.master": "local[2]", "pipeline.progress": "off",
                            "execution.checkpointing.interval": "0 s", "pipeline.name": "spend"})
pipeline.source(log(LOG, rows_per_batch=400)).key_by("user").aggregate(
    spent="sum(amount)", clicks="count(*)"
).sink(parquet(OUT))
"""


@pytest.mark.jvm
def test_log_run_and_checkpoints(tmp_path: Path) -> None:
    """``keyflow log append``, ``keyflow run --checkpoint`` in a process of its own, then
    ``keyflow checkpoints``. Its stdout is a pipe: each micro-batch is one whole line however
    long (rich wraps at 80 columns)."""
    data = events(1_000, 30, start=0, seed=4)
    data.to_json(tmp_path / "events.jsonl", orient="records", lines=True)
    appended = runner.invoke(
        app, ["log", "append", str(tmp_path / "log"), "--file", str(tmp_path / "events.jsonl"), "--key", "user"]
    )
    assert appended.exit_code == 0, appended.output
    assert "appended 1,000 records" in appended.output
    described = runner.invoke(app, ["log", "describe", str(tmp_path / "log")])
    assert "4 splits" in described.output

    out = tmp_path / "a-sink-directory-with-a-name-long-enough-to-pass-eighty-columns"
    file = tmp_path / "spend.py"
    file.write_text(f"LOG = {str(tmp_path / 'log')!r}\nOUT = {str(out)!r}\n" + PIPELINE_FILE)
    checkpoint = str(tmp_path / "ckpt")
    run = subprocess.run(
        [str(KEYFLOW), "run", str(file), "--checkpoint", checkpoint, "--available-now", "-p", "3"],
        capture_output=True, text=True, timeout=300,  # stdout is a pipe, not a terminal
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "batch 0: parallelism 3, 400 rows in" in run.stdout
    assert "micro-batches committed" in run.stdout
    batches = [line for line in run.stdout.splitlines() if line.startswith("batch ")]
    assert len(batches) == 3, run.stdout  # 1,000 rows, 400 per batch
    for number, (line, rows) in enumerate(zip(batches, (400, 400, 200), strict=True)):
        assert len(line) > 80
        assert re.fullmatch(
            rf"batch {number}: parallelism 3, {rows} rows in, [\d,]+ to sink: {re.escape(str(out))}; "
            r"state [\d,]+ bytes in \d+ files; [\d.]+ s",
            line,
        ), run.stdout

    got = read_output(out).groupby("user").last().sort_index()
    expected = data.groupby("user").agg(spent=("amount", "sum"), clicks=("amount", "size"))
    pd.testing.assert_frame_equal(got[["spent", "clicks"]], expected, check_dtype=False)

    shown = runner.invoke(app, ["checkpoints", checkpoint, "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.output)
    assert summary["pipeline"] == "spend"
    assert len(summary["versions"]) == 3  # state.checkpoints.num-retained
    assert {v["parallelism"] for v in summary["versions"]} == {3}
    (operator,) = summary["operators"]
    assert operator["keys_stored"] == data.user.nunique()
    assert operator["state_bytes"] > 0
    assert "retained versions" in runner.invoke(app, ["checkpoints", checkpoint]).output


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["checkpoints", str(tmp_path)])
    assert missing.exit_code == 2
    assert "is not a keyflow checkpoint (no plan.json, no manifests)" in missing.output
    (tmp_path / "x.txt").write_text("a")
    wrong = runner.invoke(app, ["log", "append", str(tmp_path / "log"), "--file", str(tmp_path / "x.txt")])
    assert wrong.exit_code == 2
    assert "use a .parquet, .json/.jsonl (JSON lines) or .csv file" in wrong.output
    not_a_log = runner.invoke(app, ["log", "describe", str(tmp_path)])
    assert "is not a keyflow log" in not_a_log.output


UNBOUNDED_FILE = """
from keyflow import Pipeline, datagen, parquet, sequence, zipf

pipeline = Pipeline(config={"spark.master": "local[2]", "pipeline.progress": "off",
                            "execution.checkpointing.interval": "0 s", "jobmanager.scheduler": "adaptive",
                            "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "0 s"})
pipeline.source(datagen(rows_per_second=20_000, fields={"user": zipf(50), "seq": sequence()})).key_by(
    "user").aggregate(clicks="count(*)").sink(parquet(OUT))
"""


@pytest.mark.jvm
def test_ctrl_c_stops_a_stream_cleanly(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) while micro-batches run: exit 0, a summary, no traceback, the scheduler
    log ends Canceling → Finished, and every committed batch's output is in place."""
    job_file = tmp_path / "job.py"
    job_file.write_text(UNBOUNDED_FILE.replace("OUT", repr(str(tmp_path / "out"))))
    checkpoint = tmp_path / "ckpt"
    job = subprocess.Popen(
        [str(KEYFLOW), "run", str(job_file), "--checkpoint", str(checkpoint)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    for line in job.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith("batch 2:"):
            break
    job.send_signal(signal.SIGINT)
    rest, errors = job.communicate(timeout=120)
    output = "".join(lines) + rest
    assert job.returncode == 0, output + errors
    assert "parallelism: chosen at start by the adaptive scheduler" in output
    assert "micro-batches committed" in output
    assert "Traceback" not in errors
    records = [json.loads(line) for line in (checkpoint / "scheduler.jsonl").read_text().splitlines()]
    assert [r["state"] for r in records if r["kind"] == "decision"][-2:] == ["Canceling", "Finished"]
    committed = Checkpoint(str(checkpoint)).manifests.latest()
    assert committed is not None
    assert committed.version >= 2
    # The latest running count per user adds up to the rows Spark counted into the committed
    # batches ("?": Spark's optimizer skipped an empty batch, so no rows).
    rows_in = [re.match(r"batch \d+: parallelism \d+, ([\d,]+|\?) rows in", line) for line in output.splitlines()]
    counted = [int(match.group(1).replace(",", "").replace("?", "0")) for match in rows_in if match]
    assert len(counted) == committed.version + 1, output
    assert read_output(tmp_path / "out").groupby("user").clicks.max().sum() == sum(counted)
