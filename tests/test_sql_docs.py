"""Every SQL example of docs/sql.md and examples/ runs, and prints or writes what the docs say."""

from __future__ import annotations

import runpy
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from keyflow import Log
from keyflow.changelog import current
from keyflow.cli.app import app
from tests.streams import read_output

ROOT = Path(__file__).resolve().parent.parent
SQL_DOC = ROOT / "docs" / "sql.md"
TEST_CONF = ["--conf", "spark.master=local[2]", "--conf", "pipeline.progress=off"]
runner = CliRunner()


def fenced(markdown: Path, language: str) -> list[str]:
    return [block.split("```", 1)[0] for block in markdown.read_text().split(f"```{language}\n")[1:]]


def run_sql(script: str, path: Path, *args: str) -> str:
    path.write_text(script)
    result = runner.invoke(app, ["sql", str(path), *TEST_CONF, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_doc_has_the_examples_this_test_runs() -> None:
    assert len(fenced(SQL_DOC, "sql")) == 2
    assert len(fenced(SQL_DOC, "python")) == 1


@pytest.mark.jvm
def test_first_script_prints_five_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    output = run_sql(fenced(SQL_DOC, "sql")[0], tmp_path / "first.sql")
    lines = [line for line in output.splitlines() if line.startswith("per_user> +I[")]
    assert sorted(int(line.split("[")[1].split(",")[0]) for line in lines) == [1, 2, 3, 4, 5]
    assert sum(int(line.split(", ")[1]) for line in lines) == pytest.approx(9_900, abs=60)  # ~1 % have price <= 1


@pytest.mark.jvm
def test_python_example_mixes_sql_and_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (block,) = fenced(SQL_DOC, "python")
    exec(compile(block, "docs/sql.md", "exec"), {"__name__": "docs_example"})  # it asserts its own result


@pytest.mark.jvm
def test_worked_retraction_example_prints_what_the_doc_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    schema = pa.schema([("payment_id", pa.int64()), ("payer", pa.string()), ("amount", pa.int64())])
    payments = Log.create("data/payments", 2, schema)
    batches = [
        [(1, "alice", 10), (2, "bob", 5), (3, "alice", 7)],
        [(1, "alice", 15), (3, None, None), (2, "alice", 5)],
    ]
    printed = []
    for rows in batches:
        payments.append(
            pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema), "payment_id"
        )
        output = run_sql(
            fenced(SQL_DOC, "sql")[1], tmp_path / "payments.sql", "--checkpoint", "ckpt", "--available-now"
        )
        printed.append(sorted(line for line in output.splitlines() if line[:3] in ("+I[", "-U[", "+U[", "-D[")))
    shown = fenced(SQL_DOC, "text")[0].split()
    shown_lines = [" ".join(shown[i : i + 3]) for i in range(0, len(shown), 3)]
    assert printed == [sorted(shown_lines[:2]), sorted(shown_lines[2:])]


@pytest.mark.jvm
def test_orders_example_equals_a_pandas_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    writer = runpy.run_path(str(ROOT / "examples" / "orders_log.py"))
    writer["main"]("data/orders", batches=3)
    script = (ROOT / "examples" / "orders.sql").read_text()
    output = run_sql(script, tmp_path / "orders.sql", "--checkpoint", "ckpt/orders", "--available-now")
    assert "[0] parallelism 3: orders" in output
    assert "<- [0] hash by order_id" in output
    orders = Log("data/orders")
    history = pa.concat_tables(
        [
            pa.Table.from_batches(list(orders.read(split, 0, end)), schema=orders.schema)
            for split, end in enumerate(orders.end_offsets())
        ]
    ).to_pandas()
    latest = history.groupby("order_id").tail(1)  # each order lives in one split, in append order
    latest = latest[latest["user_id"].notna()]
    expected = (
        latest.groupby("user_id")["amount"]
        .agg(orders="size", revenue="sum", largest="max")
        .reset_index()
        .sort_values("user_id")
        .reset_index(drop=True)
    )
    changelog = pa.Table.from_pandas(read_output(tmp_path / "out" / "revenue"), preserve_index=False)
    got = current(changelog).to_pandas().sort_values("user_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-9)
