"""datagen, filesystem sources and sinks, console, and configuration files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyflow import (
    Pipeline,
    choice,
    console,
    datagen,
    files,
    random_float,
    random_int,
    random_string,
    sequence,
    timestamp,
    zipf,
)
from keyflow.config import MAX_PARALLELISM, PIPELINE_NAME
from tests.pipelines import TEST_SPARK

FIELDS = {
    "n": sequence(start=10, step=2),
    "user": zipf(100, exponent=1.2, prefix="u"),
    "popularity": zipf(100, exponent=1.0),
    "qty": random_int(1, 6),
    "price": random_float(5.0, 10.0),
    "code": random_string(6),
    "page": choice(["a", "b", "c"]),
    "ts": timestamp(start="2026-01-01 00:00:00", step_ms=500),
}


def generate(parallelism: int, rows: int = 20_000, seed: int = 7) -> pd.DataFrame:
    p = Pipeline(parallelism=parallelism, config=TEST_SPARK)
    return p.source(datagen(rows=rows, fields=FIELDS, seed=seed)).to_pandas().sort_values("n", ignore_index=True)


@pytest.mark.jvm
def test_datagen_is_the_same_at_any_parallelism_and_ranges_hold() -> None:
    one, three = generate(1), generate(3)
    pd.testing.assert_frame_equal(one, three)
    assert one.n.tolist() == list(range(10, 10 + 2 * 20_000, 2))
    assert one.qty.between(1, 6).all()
    assert set(one.qty) == set(range(1, 7))
    assert one.price.between(5.0, 10.0).all()
    assert one.code.str.fullmatch(r"[0-9a-f]{6}").all()
    assert set(one.page) == {"a", "b", "c"}
    assert one.popularity.between(1, 100).all()
    assert (one.ts.diff().dropna() == pd.Timedelta(milliseconds=500)).all()
    assert not one.equals(generate(1, seed=8))


@pytest.mark.jvm
def test_zipf_keys_follow_the_power_law() -> None:
    """Frequencies of the top ranks match P(k) ~ 1/k^s of the continuous law datagen inverts."""
    frame = generate(2, rows=200_000)
    counts = frame.popularity.value_counts(normalize=True).sort_index()
    edges = np.arange(1, 102, dtype=float)
    cdf = np.log(edges) / np.log(101)  # exponent 1.0: P(rank <= x) = ln(x) / ln(n + 1)
    expected = np.diff(cdf)[:5]
    np.testing.assert_allclose(counts.iloc[:5].to_numpy(), expected, rtol=0.03)
    assert counts.iloc[0] > 5 * counts.iloc[50]


@pytest.mark.jvm
@pytest.mark.parametrize("format", ["json", "csv"])
def test_text_file_sources_read_with_a_schema(tmp_path: Path, format: str) -> None:
    frame = pd.DataFrame({"user": ["a", "b", "a"], "price": [1.5, 2.0, 3.25]})
    (tmp_path / "in").mkdir()
    if format == "json":
        frame.to_json(tmp_path / "in" / "x.json", orient="records", lines=True)
    else:
        frame.to_csv(tmp_path / "in" / "x.csv", index=False)
    p = Pipeline(parallelism=2, config=TEST_SPARK)
    source = files(tmp_path / "in", format=format, schema="user string, price double")
    result = p.source(source).key_by("user").aggregate(total="sum(price)").to_pandas()
    assert result.set_index("user").total.to_dict() == {"a": 4.75, "b": 2.0}


@pytest.mark.jvm
def test_csv_schema_is_inferred_without_one(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pd.DataFrame({"k": [1, 2], "v": [0.5, 1.5]}).to_csv(tmp_path / "in" / "x.csv", index=False)
    p = Pipeline(parallelism=1, config=TEST_SPARK)
    result = p.source(files(tmp_path / "in", format="csv")).to_pandas()
    assert result.to_dict("list") == {"k": [1, 2], "v": [0.5, 1.5]}


@pytest.mark.jvm
def test_console_sink_prints_rows(capsys: pytest.CaptureFixture[str]) -> None:
    p = Pipeline(parallelism=1, config=TEST_SPARK)
    p.source(datagen(rows=3, fields={"n": sequence(start=41)})).sink(console(title="numbers"))
    result = p.run()
    out = capsys.readouterr().out
    assert "41" in out
    assert "43" in out
    assert result.sinks[0].rows == 3


def test_yaml_config_file(tmp_path: Path) -> None:
    config = tmp_path / "keyflow.yaml"
    config.write_text(
        "parallelism:\n  default: 3\npipeline:\n  max-parallelism: 96\n  name: from-yaml\nspark:\n  master: local[2]\n"
    )
    p = Pipeline(config=config)
    assert p.config.default_parallelism() == 3
    assert p.config.get(MAX_PARALLELISM) == 96
    assert p.config.get(PIPELINE_NAME) == "from-yaml"
    assert p.config.spark == {"spark.master": "local[2]"}


def test_unsupported_file_format() -> None:
    from keyflow import PlanError

    with pytest.raises(PlanError, match="file format 'avro' is not supported; choose one of parquet, json, csv"):
        files("x", format="avro")


@pytest.mark.jvm
def test_relative_paths_follow_the_python_working_directory(
    spark: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's JVM keeps the directory it started in; keyflow resolves relative paths itself."""
    from keyflow import parquet

    monkeypatch.chdir(tmp_path)
    Path("in").mkdir()
    pd.DataFrame({"k": [1, 2, 3]}).to_parquet("in/x.parquet", index=False)
    p = Pipeline(parallelism=1, config=TEST_SPARK)
    p.source(files("in")).sink(parquet("out/copy"))
    p.run()
    assert sorted(pd.read_parquet(tmp_path / "out" / "copy").k) == [1, 2, 3]


def test_every_connector_meets_its_contract(tmp_path) -> None:
    """The runtime calls connectors only through keyflow.connectors.base."""
    from keyflow import blackhole, console, csv, datagen, files, json, log, parquet, sequence
    from keyflow.connectors.base import Sink, Source, StreamingSink, StreamingSource
    from tests.streams import append, events

    append(tmp_path / "log", events(10, 3, start=0, seed=1))
    fields = {"n": sequence()}
    generated = (datagen(rows=1, fields=fields), datagen(rows_per_second=1, fields=fields))
    for source in (*generated, files(tmp_path), log(str(tmp_path / "log"))):
        assert isinstance(source, Source)
        assert isinstance(source, StreamingSource)
    for sink in (parquet(tmp_path / "a"), json(tmp_path / "b"), csv(tmp_path / "c"), console(), blackhole()):
        assert isinstance(sink, Sink)
        assert isinstance(sink, StreamingSink)


def test_a_sink_without_exactly_once_output_is_refused_by_a_streaming_run(tmp_path) -> None:
    from keyflow import Pipeline, PlanError, log
    from tests.streams import append, config, events

    class PrintingSink:  # a batch-only sink: write, but no stage/publish
        def describe(self) -> dict[str, str]:
            return {"connector": "printing"}

        def write(self, frame: object) -> int:
            return 0

    append(tmp_path / "log", events(10, 3, start=0, seed=1))
    pipeline = Pipeline(config=config(2))
    pipeline.source(log(str(tmp_path / "log"))).sink(PrintingSink())
    with pytest.raises(PlanError, match=r"sink: printing .* cannot take part in a streaming run.*use parquet"):
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
