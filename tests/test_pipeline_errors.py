"""Every bad input to a pipeline gets one clear error naming the thing, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from keyflow import (
    ConfigError,
    DataError,
    KeyedBatch,
    KeyedState,
    Pipeline,
    PipelineError,
    PlanError,
    ValueState,
    files,
    parquet,
)
from tests.pipelines import TEST_SPARK


@pytest.fixture(scope="module")
def with_nulls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nulls")
    pd.DataFrame({"user": ["a", None, "b", None, "a"], "price": [1.0, 2.0, 3.0, 4.0, 5.0]}).to_parquet(
        path / "part-0.parquet", index=False
    )
    return path


def pipeline(**config: object) -> Pipeline:
    return Pipeline(parallelism=2, config={**TEST_SPARK, **config})


@pytest.mark.jvm
@pytest.mark.parametrize("parallelism", [1, 2])
def test_null_keys_fail_with_the_count(with_nulls: Path, parallelism: int) -> None:
    """Also at parallelism 1, where Spark's one-partition exchange ignores the routing expression."""
    p = Pipeline(parallelism=parallelism, config=TEST_SPARK)
    stream = p.source(files(with_nulls)).key_by("user").aggregate(total="sum(price)").set_name("per_user")
    with pytest.raises(DataError, match=r"operator 'per_user': 2 of 5 rows have a null in key column\(s\) \['user'\]"):
        stream.to_arrow()


@pytest.mark.jvm
def test_null_keys_can_be_dropped(with_nulls: Path) -> None:
    stream = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls)).key_by("user")
    result = stream.aggregate(total="sum(price)").to_pandas().set_index("user").total.to_dict()
    assert result == {"a": 6.0, "b": 3.0}


@pytest.mark.jvm
def test_null_keys_go_to_a_dead_letter_sink_and_none_are_lost(with_nulls: Path, tmp_path: Path) -> None:
    p = pipeline()
    dead = parquet(tmp_path / "dead")
    p.source(files(with_nulls)).key_by("user", on_null=dead).aggregate(total="sum(price)").sink(
        parquet(tmp_path / "ok")
    )
    result = p.run()
    assert pd.read_parquet(tmp_path / "dead").price.sort_values().tolist() == [2.0, 4.0]
    assert pd.read_parquet(tmp_path / "ok").total.sum() == 9.0
    assert sorted(sink.rows for sink in result.sinks) == [2, 2]


@pytest.mark.jvm
def test_unknown_key_column(with_nulls: Path) -> None:
    stream = pipeline().source(files(with_nulls)).key_by("usr").aggregate(n="count(*)").set_name("per_user")
    with pytest.raises(
        PlanError,
        match=r"operator 'per_user': key_by column\(s\) \['usr'\] not found; available columns: \['user', 'price'\]",
    ):
        stream.to_arrow()


@pytest.mark.jvm
def test_unknown_column_in_an_expression(with_nulls: Path) -> None:
    stream = pipeline().source(files(with_nulls)).filter("prise > 0", name="positive")
    with pytest.raises(
        PlanError, match=r"operator 'positive' \(filter: condition=prise > 0\): .*`prise` cannot be resolved"
    ):
        stream.to_arrow()


def wrong_columns(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    return pa.table({"user": batch.keys.column("user"), "oops": pa.array([1] * batch.num_keys)})


def wrong_types(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    return pa.table({"user": batch.keys.column("user"), "total": pa.array(["x"] * batch.num_keys)})


@pytest.mark.jvm
def test_process_returning_the_wrong_columns(with_nulls: Path) -> None:
    stream = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls)).key_by("user")
    result = stream.process(wrong_columns, schema="user string, total double")
    with pytest.raises(
        DataError,
        match=r"process 'wrong_columns' returned columns \['user', 'oops'\] "
        r"but its schema declares \['user', 'total'\]",
    ):
        result.to_arrow()


@pytest.mark.jvm
def test_process_returning_the_wrong_types(with_nulls: Path) -> None:
    stream = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls)).key_by("user")
    result = stream.process(wrong_types, schema="user string, total double")
    with pytest.raises(
        DataError, match=r"process 'wrong_types' returned \(user string, total string\) which does not fit"
    ):
        result.to_arrow()


def failing(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    raise ZeroDivisionError("division by zero")


@pytest.mark.jvm
def test_process_function_that_raises(with_nulls: Path) -> None:
    stream = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls)).key_by("user")
    with pytest.raises(PipelineError, match=r"^process 'failing' raised ZeroDivisionError: division by zero$"):
        stream.process(failing, schema="user string", state={"s": ValueState("int64")}).to_arrow()


@pytest.mark.jvm
def test_corrupt_input_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(PipelineError, match=r"bad\.parquet"):
        pipeline().source(files(tmp_path / "in")).to_arrow()


@pytest.mark.jvm
def test_malformed_json_record_is_an_error_not_a_null(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "events.json").write_text('{"user": "a", "price": 1}\n{"user": "b", "price": \n')
    source = files(tmp_path / "in", format="json", schema="user string, price double")
    with pytest.raises(DataError, match=r"cannot read input file .*events\.json \(a malformed record\)"):
        pipeline().source(source).to_arrow()


@pytest.mark.jvm
def test_missing_input_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"input path .*nowhere does not exist"):
        pipeline().source(files(tmp_path / "nowhere")).to_arrow()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"paralelism.default": 2},
            "unknown configuration key 'paralelism.default'; did you mean parallelism.default?",
        ),
        (
            {"pipeline.max-parallelism": 40000},
            "pipeline.max-parallelism=40000 is invalid; it must be between 1 and 32768",
        ),
        ({"parallelism.default": "two"}, "parallelism.default='two' is invalid; it must be a positive integer"),
        ({"pipeline.null-keys": "ignore"}, "pipeline.null-keys='ignore' is invalid; choose one of fail, drop"),
    ],
)
def test_invalid_options(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("?", r"\?")):
        Pipeline(config=config)


def test_invalid_api_arguments() -> None:
    from keyflow import datagen, random_int

    p = Pipeline(parallelism=2)
    source = p.source(datagen(rows=5, fields={"k": random_int(1, 3)}))
    with pytest.raises(PlanError, match="parallelism=0 is invalid"):
        source.set_parallelism(0)
    with pytest.raises(PlanError, match="key_by needs one or more column names"):
        source.key_by()
    with pytest.raises(PlanError, match="aggregate needs name='aggregate expression' pairs"):
        source.key_by("k").aggregate()
    with pytest.raises(PlanError, match=r"aggregate output \['k'\] has the name of a key column"):
        source.key_by("k").aggregate(k="count(*)")
    with pytest.raises(PlanError, match="'nonsense' is not an Arrow type"):
        source.key_by("k").process(failing, schema="k int", state={"s": ValueState("nonsense")})
    with pytest.raises(PlanError, match="the pipeline has no sink"):
        p.run()  # p.plan() shows the streams instead (issue 10: to_pandas() pipelines have a plan)
    with pytest.raises(PlanError, match=r"random_int\(low=3, high=1\) is empty"):
        random_int(3, 1)
    with pytest.raises(PlanError, match=r"random_int\(low=0.5, high=2\) needs integers; use random_float"):
        random_int(0.5, 2)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="an operator name must be a non-empty string, got ''"):
        source.set_name("")
    from keyflow import timestamp

    with pytest.raises(PlanError, match=r"timestamp\(start='tomorrow'\) is not an ISO 8601 time"):
        timestamp(start="tomorrow")


@pytest.mark.jvm
def test_map_batches_schema_that_cannot_be_inferred(with_nulls: Path) -> None:
    def needs_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.slice(0, 1).column(0)[0]  # fails on an empty batch

    stream = pipeline().source(files(with_nulls)).map_batches(needs_rows)
    with pytest.raises(PlanError, match=r"map_batches 'needs_rows': could not infer the output schema .*pass schema="):
        stream.to_arrow()


@pytest.mark.jvm
def test_map_batches_in_pandas_format(with_nulls: Path) -> None:
    def upper(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(user=frame.user.str.upper())

    rows = pipeline().source(files(with_nulls)).map_batches(upper, batch_format="pandas").to_pandas()
    assert sorted(rows.user.dropna()) == ["A", "A", "B"]
    assert rows.price.sum() == 15.0


@pytest.mark.jvm
def test_keywords_named_like_options_are_columns(with_nulls: Path) -> None:
    """``name`` and ``parallelism`` are ordinary column names for with_columns and aggregate."""
    source = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls))
    rows = source.with_columns(name="upper(user)", parallelism="price * 2").to_pandas()
    assert sorted(rows.columns) == ["name", "parallelism", "price", "user"]
    totals = source.key_by("user").aggregate(name="first(user)", parallelism="count(*)").to_pandas()
    assert sorted(totals.columns) == ["name", "parallelism", "user"]
    assert totals.set_index("user").parallelism.to_dict() == {"a": 2, "b": 1}


@pytest.mark.jvm
def test_invalid_spark_setting_is_a_config_error(spark: object) -> None:
    stream = pipeline(**{"spark.sql.shuffle.partitions": "abc"}).source(files(Path(__file__).parent))
    with pytest.raises(ConfigError, match=r"spark.sql.shuffle.partitions='abc' was rejected by Spark"):
        stream.to_arrow()


def mixed_pandas(batch: KeyedBatch, state: KeyedState) -> pd.DataFrame:
    return pd.DataFrame({"user": ["a", 1][: batch.num_keys] * batch.num_keys})


@pytest.mark.jvm
def test_pandas_result_arrow_cannot_convert(with_nulls: Path) -> None:
    stream = pipeline(**{"pipeline.null-keys": "drop"}).source(files(with_nulls)).key_by("user")
    with pytest.raises(DataError, match=r"process 'mixed_pandas' returned a pandas DataFrame Arrow cannot convert"):
        stream.process(mixed_pandas, schema="user string").to_arrow()
