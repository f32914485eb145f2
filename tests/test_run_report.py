"""``keyflow run --report`` / ``keyflow plan --report``: the executed plan as an HTML page,
loaded in a real headless Chromium (installed from the OS packages when missing) and read
back as a person would see it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keyflow.cli.app import app

KEYFLOW = Path(sys.executable).with_name("keyflow")

PIPELINE_FILE = """
import numpy as np, pandas as pd
from keyflow import Pipeline, files, parquet
rng = np.random.default_rng(5)
pd.DataFrame({"user": (rng.zipf(1.2, 200_000) % 3_000).astype("int64"), "amount": rng.integers(1, 9, 200_000)}
             ).to_parquet(IN + "/part-0.parquet", index=False)
pipeline = Pipeline(config={"spark.master": "local[2]", "pipeline.progress": "off",
                            "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "32kb"})
events = pipeline.source(files(IN))
events.key_by("user").aggregate(n="count(*)", total="sum(amount)").set_name("per_user").sink(parquet(OUT + "/a"))
events.key_by("amount").aggregate(n="count(*)").set_name("per_amount").sink(parquet(OUT + "/b"))
"""


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium of the OS packages (Debian: ``chromium``), installed when missing."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, timeout=600, check=False)
        found = shutil.which("chromium")
    if found is None:
        pytest.fail("headless Chromium is needed to check the HTML report: apt-get install chromium")
    return found


def browse(chromium: str, page: Path, *flags: str) -> str:
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", *flags, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


@pytest.mark.jvm
def test_run_report_shows_each_stage_its_parallelism_and_loads(tmp_path: Path, chromium: str) -> None:
    (tmp_path / "in").mkdir()
    file = tmp_path / "job.py"
    file.write_text(f"IN = {str(tmp_path / 'in')!r}\nOUT = {str(tmp_path / 'out')!r}\n" + PIPELINE_FILE)
    report = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["run", str(file), "--json", "--report", str(report)])  # on the shared session
    assert result.exit_code == 0, result.output
    stages = {stage["operator"]: stage for stage in json.loads(result.stdout.splitlines()[-1])["stages"]}
    assert set(stages) == {"per_user", "per_amount"}
    assert stages["per_user"]["parallelism"] == 2  # max: the 2 slots of local[2]
    assert stages["per_amount"]["parallelism"] == 1  # 8 keys: a few hundred bytes
    assert [s["rows"] for s in stages["per_amount"]["subtasks"]] == [stages["per_amount"]["input_rows"]]
    assert sum(s["rows"] for s in stages["per_user"]["subtasks"]) == stages["per_user"]["input_rows"]

    dom = browse(chromium, report, "--dump-dom")
    assert "Keyed stage \u201cper_user\u201d" in dom  # in quotation marks
    for stage in stages.values():
        assert f"decided parallelism <b>{stage['parallelism']}</b>" in dom
        assert f"{stage['input_bytes']:,} bytes" in dom
        for subtask in stage["subtasks"]:
            assert f"{subtask['key_groups'][0]}\u2013{subtask['key_groups'][1]}" in dom  # an en dash
            assert f"{subtask['bytes']:,}" in dom
            assert f'<td class="n">{subtask["rows"]:,}</td>' in dom
    assert dom.count("<svg") == 2  # one bar chart per stage
    assert "hash by user to vertex" in dom

    screenshot = tmp_path / "report.png"
    browse(chromium, report, f"--screenshot={screenshot}", "--window-size=1200,1400")
    assert screenshot.stat().st_size > 20_000  # drawn, not blank


def test_plan_report_without_a_run(tmp_path: Path, chromium: str) -> None:
    (tmp_path / "in").mkdir()
    file = tmp_path / "job.py"
    file.write_text(f"IN = {str(tmp_path / 'in')!r}\nOUT = {str(tmp_path / 'out')!r}\n" + PIPELINE_FILE)
    report = tmp_path / "plan.html"
    result = subprocess.run([str(KEYFLOW), "plan", str(file), "--report", str(report)], capture_output=True,
                            text=True, timeout=300, check=False, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "auto-parallelism: 'per_user', 'per_amount' sized from input bytes at run time" in result.stdout
    dom = browse(chromium, report, "--dump-dom")
    assert "aggregate <b>per_user</b>" in dom
    assert "No keyed stage was sized from its input" in dom
