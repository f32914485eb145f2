"""``keyflow plan`` and ``keyflow run`` on pipeline files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from keyflow.cli.app import app
from tests.pipelines import TEST_SPARK

runner = CliRunner()
KEYFLOW = Path(sys.executable).with_name("keyflow")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "clickstream.py"

PIPELINE_FILE = """
from keyflow import Pipeline, datagen, parquet, random_int, sequence

pipeline = Pipeline(parallelism=2, config={"spark.master": "local[2]", "pipeline.progress": "off"})
numbers = pipeline.source(datagen(rows=1000, fields={"n": sequence(), "k": random_int(1, 100)}, seed=1))
numbers.key_by("k").aggregate(total="sum(n)", count="count(*)").sink(parquet(OUT))

if __name__ == "__main__":
    raise SystemExit("the CLI must not run the __main__ block")
"""


def write_pipeline(tmp_path: Path) -> Path:
    file = tmp_path / "numbers.py"
    file.write_text(f"OUT = {str(tmp_path / 'out')!r}\n" + PIPELINE_FILE)
    return file


def test_plan_of_the_example_as_json() -> None:
    result = runner.invoke(app, ["plan", str(EXAMPLE), "--json", "--conf", "parallelism.default=3"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["name"] == "clickstream"
    assert plan["max_parallelism"] == 27720
    assert plan["default_parallelism"] == 3
    kinds = [op["kind"] for vertex in plan["vertices"] for op in vertex["operators"]]
    assert kinds.count("aggregate") == 2
    assert kinds.count("process") == 1
    assert {edge["partitioner"] for edge in plan["edges"]} == {"rebalance", "hash"}


@pytest.mark.jvm
def test_run_writes_output_and_conf_wins(tmp_path: Path) -> None:
    """In this process, on the shared SparkSession: ``keyflow run`` as a process of its own is
    tested by the main job and by the helper-modules test below."""
    file = write_pipeline(tmp_path)
    conf = ["--conf", "parallelism.default=3", "--conf", "execution.batch.adaptive.auto-parallelism.enabled=false"]
    result = runner.invoke(app, ["run", str(file), "--json", *conf])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["plan"]["default_parallelism"] == 3
    assert report["sinks"][0]["rows"] == 100
    written = pd.read_parquet(tmp_path / "out")
    assert written.total.sum() == sum(range(1000))
    assert written["count"].sum() == 1000
    assert sorted(written.k) == list(range(1, 101))
    assert len(list((tmp_path / "out").glob("*.parquet"))) == 3  # one file per subtask at parallelism 3


def test_run_errors_are_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    result = runner.invoke(app, ["run", str(empty)])
    assert result.exit_code == 2
    assert "must define exactly one Pipeline at module level, found none" in result.output
    result = runner.invoke(app, ["plan", str(write_pipeline(tmp_path)), "--conf", "pipeline.max-parallelism=1"])
    assert result.exit_code == 2
    assert "above pipeline.max-parallelism 1" in result.output
    result = runner.invoke(app, ["plan", str(tmp_path / "missing.py")])
    assert "pipeline file" in result.output
    assert "does not exist" in result.output
    result = runner.invoke(app, ["plan", str(write_pipeline(tmp_path)), "--conf", "novalue"])
    assert "--conf 'novalue' is not key=value" in result.output


@pytest.mark.jvm
def test_the_main_job_outputs_agree_with_each_other(tmp_path: Path) -> None:
    """make demo's pipeline: running spend recomputed with pandas matches, and the three
    outputs agree on clicks and revenue per user and in total."""
    result = subprocess.run(
        [str(KEYFLOW), "run", str(EXAMPLE)], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out" / "clickstream"
    per_user = pd.read_parquet(out / "per_user").set_index("user")
    per_page = pd.read_parquet(out / "per_page")
    running = pd.read_parquet(out / "running_spend").sort_values(["user", "ts"])
    assert len(running) == per_user.clicks.sum() == per_page.clicks.sum()
    assert (running.price > 0).all()
    pd.testing.assert_series_equal(
        running.running_spend, running.groupby("user").price.cumsum(), check_names=False, rtol=1e-9
    )
    assert (running.first_seen == running.groupby("user").ts.transform("min")).all()
    last = running.groupby("user").running_spend.last()
    pd.testing.assert_series_equal(last.sort_index(), per_user.revenue.sort_index(), check_names=False, rtol=1e-9)
    assert abs(per_page.revenue.sum() - per_user.revenue.sum()) < 1e-6 * per_user.revenue.sum()
    assert "written to" in result.stdout


HELPERS = {
    "pipeline.py": """
from helpers import running_total
from mylib.ops import doubled

from keyflow import Pipeline, ValueState, files, parquet

pipeline = Pipeline(parallelism=2)
pipeline.source(files(IN)).map_batches(doubled).key_by("k").process(
    running_total, "k long, n long, twice long, total long", state={"total": ValueState("int64")}, order_by="n"
).sink(parquet(OUT))
""",
    "helpers.py": """
import pyarrow as pa

from keyflow import KeyedBatch, KeyedState


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    total = state["total"]
    running = batch.running_sum(batch.data.column("twice"), initial=total.get())
    total.update(batch.last_per_key(running))
    return batch.data.select(["k", "n", "twice"]).append_column("total", pa.array(running))
""",
    "mylib/__init__.py": "",
    "mylib/ops.py": """
import pyarrow as pa
import pyarrow.compute as pc

FACTOR = 2


def doubled(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("twice", pc.multiply(batch.column("n"), FACTOR))
""",
}


@pytest.mark.jvm
def test_run_ships_helper_modules_next_to_the_pipeline_file(tmp_path: Path) -> None:
    """Functions imported from helpers.py and mylib/ops.py beside the file run on Spark's
    Python workers, whose sys.path does not have the file's directory."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for name, text in HELPERS.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    prefix = f"IN = {str(tmp_path / 'in')!r}\nOUT = {str(tmp_path / 'out')!r}\n"
    (project / "pipeline.py").write_text(prefix + HELPERS["pipeline.py"])
    numbers = pd.DataFrame({"k": [n * 7 % 5 for n in range(300)], "n": range(300)})
    (tmp_path / "in").mkdir()
    numbers.to_parquet(tmp_path / "in" / "part-0.parquet", index=False)
    elsewhere.mkdir()
    conf = [arg for key, value in TEST_SPARK.items() for arg in ("-c", f"{key}={value}")]
    result = subprocess.run(
        [str(KEYFLOW), "run", str(project / "pipeline.py"), *conf],
        capture_output=True, text=True, check=False, cwd=elsewhere,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    got = pd.read_parquet(tmp_path / "out").sort_values("n").reset_index(drop=True)
    expected = numbers.assign(twice=numbers.n * 2)
    expected["total"] = expected.groupby("k").twice.cumsum()
    pd.testing.assert_frame_equal(got, expected[["k", "n", "twice", "total"]], check_dtype=False)
