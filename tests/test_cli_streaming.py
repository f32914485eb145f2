"""``keyflow log``, ``keyflow run --checkpoint`` and ``keyflow checkpoints`` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from keyflow.cli.app import app
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


def test_log_run_and_checkpoints(tmp_path: Path) -> None:
    data = events(1_000, 30, start=0, seed=4)
    data.to_json(tmp_path / "events.jsonl", orient="records", lines=True)
    appended = runner.invoke(
        app, ["log", "append", str(tmp_path / "log"), "--file", str(tmp_path / "events.jsonl"), "--key", "user"]
    )
    assert appended.exit_code == 0, appended.output
    assert "appended 1,000 records" in appended.output
    described = runner.invoke(app, ["log", "describe", str(tmp_path / "log")])
    assert "4 splits" in described.output

    file = tmp_path / "spend.py"
    file.write_text(f"LOG = {str(tmp_path / 'log')!r}\nOUT = {str(tmp_path / 'out')!r}\n" + PIPELINE_FILE)
    checkpoint = str(tmp_path / "ckpt")
    run = subprocess.run(
        [str(KEYFLOW), "run", str(file), "--checkpoint", checkpoint, "--available-now", "-p", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "batch 0: parallelism 3, 400 rows in" in run.stdout
    assert "micro-batches committed" in run.stdout  # 400 rows at most per batch: at least 3

    got = read_output(tmp_path / "out").groupby("user").last().sort_index()
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
    assert "is not a keyflow checkpoint (no plan.json)" in missing.output
    (tmp_path / "x.txt").write_text("a")
    wrong = runner.invoke(app, ["log", "append", str(tmp_path / "log"), "--file", str(tmp_path / "x.txt")])
    assert wrong.exit_code == 2
    assert "use a .parquet, .json/.jsonl (JSON lines) or .csv file" in wrong.output
    not_a_log = runner.invoke(app, ["log", "describe", str(tmp_path)])
    assert "is not a keyflow log" in not_a_log.output
