"""Pipelines on a real local Spark over real files give the answers pandas gives,
at parallelism 1, 2 and 3 alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import KeyedBatch, KeyedState, ListState, MapState, Pipeline, ValueState, files, parquet
from keyflow.plan.compile import compile_plan
from keyflow.runtime.frames import FrameBuilder
from keyflow.runtime.session import spark_session
from tests.pipelines import FIXED, TEST_SPARK, write_clicks

pytestmark = pytest.mark.jvm  # every test here runs Spark


@pytest.fixture(scope="module")
def clicks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    path = tmp_path_factory.mktemp("clicks")
    return path, write_clicks(path)


def pipeline(parallelism: int, **config: object) -> Pipeline:
    return Pipeline(parallelism=parallelism, config={**TEST_SPARK, **config})


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_keyed_aggregate_equals_pandas(clicks: tuple[Path, pd.DataFrame], parallelism: int) -> None:
    path, frame = clicks
    p = pipeline(parallelism)
    result = (
        p.source(files(path))
        .filter("price > 0")
        .key_by("user")
        .aggregate(clicks="count(*)", revenue="sum(price)", low="min(price)", high="max(price)", mean="avg(price)")
        .to_pandas()
        .sort_values("user", ignore_index=True)
    )
    paid = frame[frame.price > 0]
    expected = (
        paid.groupby("user")
        .agg(
            clicks=("price", "size"),
            revenue=("price", "sum"),
            low=("price", "min"),
            high=("price", "max"),
            mean=("price", "mean"),
        )
        .reset_index()
        .sort_values("user", ignore_index=True)
    )
    pd.testing.assert_frame_equal(result, expected, check_dtype=False, rtol=1e-9)


def test_first_and_last_pick_one_of_the_keys_values(clicks: tuple[Path, pd.DataFrame]) -> None:
    """Spark's first/last are order-dependent in batch; each must still be a value of that key."""
    path, frame = clicks
    stream = pipeline(2).source(files(path)).key_by("user").aggregate(first="first(n)", last="last(n)")
    result = stream.collect(as_pandas=True)
    assert isinstance(stream.collect(), pa.Table)
    values = frame.groupby("user").n.apply(set)
    assert len(result) == len(values)
    for row in result.itertuples():
        assert row.first in values[row.user]
        assert row.last in values[row.user]


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_stateless_chain_equals_pandas(clicks: tuple[Path, pd.DataFrame], parallelism: int) -> None:
    path, frame = clicks

    def add_tax(batch: pa.RecordBatch) -> pa.RecordBatch:
        price = batch.column("price").to_numpy()
        return pa.RecordBatch.from_arrays([batch.column("n"), pa.array(price * 1.2)], names=["n", "gross"])

    result = (
        pipeline(parallelism)
        .source(files(path), parallelism=1)
        .with_columns(cents="CAST(round(price * 100) AS BIGINT)")
        .filter("cents % 3 = 0")
        .select("n", "price")
        .map_batches(add_tax)
        .to_pandas()
        .sort_values("n", ignore_index=True)
    )
    kept = frame[(np.round(frame.price * 100).astype(np.int64) % 3) == 0]
    expected = pd.DataFrame({"n": kept.n.to_numpy(), "gross": kept.price.to_numpy() * 1.2})
    pd.testing.assert_frame_equal(result, expected, check_dtype=False)


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Running spend and visit number per user in time order, continued through value state."""
    total, visits = state["total"], state["visits"]
    price = batch.data.column("price").to_numpy()
    cumulative = np.cumsum(price)
    before = (cumulative[batch.starts] - price[batch.starts])[batch.key_index]
    carried = total.get().fill_null(0.0).to_numpy(zero_copy_only=False)[batch.key_index]
    running = cumulative - before + carried
    seen = visits.get().fill_null(0).to_numpy(zero_copy_only=False)
    visit = np.arange(batch.data.num_rows) - batch.starts[batch.key_index] + 1 + seen[batch.key_index]
    total.update(pa.array(running[batch.starts + batch.counts - 1]))
    visits.update(pa.array(seen + batch.counts))
    return pa.table({"n": batch.data.column("n"), "running": running, "visit": visit})


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_process_with_value_state_equals_pandas(clicks: tuple[Path, pd.DataFrame], parallelism: int) -> None:
    """Tiny Arrow batches split keys; with order_by the runner reassembles whole keys, in time order."""
    path, frame = clicks
    p = pipeline(parallelism, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "97"})
    result = (
        p.source(files(path))
        .key_by("user")
        .process(
            running_total,
            schema="n long, running double, visit long",
            state={"total": ValueState("float64"), "visits": ValueState("int64")},
            order_by=["ts"],
        )
        .to_pandas()
        .sort_values("n", ignore_index=True)
    )
    ordered = frame.sort_values(["user", "ts"])
    expected = pd.DataFrame(
        {
            "n": ordered.n.to_numpy(),
            "running": ordered.groupby("user").price.cumsum().to_numpy(),
            "visit": ordered.groupby("user").cumcount().to_numpy() + 1,
        }
    ).sort_values("n", ignore_index=True)
    pd.testing.assert_frame_equal(result, expected, check_dtype=False, rtol=1e-9)


def pages_per_user(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Emit each user's page list and per-page click counts once the batch is processed."""
    pages, counts = state["pages"], state["counts"]
    pages.add(batch.data.column("page"), batch.key_index)
    counts_now = counts.get().to_pylist()
    page_values = batch.data.column("page").to_pylist()
    for position, start, count in zip(range(batch.num_keys), batch.starts, batch.counts, strict=True):
        merged = dict(counts_now[position] or [])
        for page in page_values[start : start + count]:
            merged[page] = merged.get(page, 0) + 1
        counts_now[position] = list(merged.items())
    keys_of_map = [key for entry in counts_now for key, _ in entry]
    values_of_map = [value for entry in counts_now for _, value in entry]
    owners = np.repeat(np.arange(batch.num_keys), [len(entry) for entry in counts_now])
    counts.put(keys_of_map, values_of_map, owners)
    return pa.table({"user": batch.keys.column("user"), "pages": pages.get(), "counts": counts.get()})


def test_list_and_map_state_accumulate_across_batches(clicks: tuple[Path, pd.DataFrame]) -> None:
    """Without order_by a key's rows span calls (batches of 50 rows), so only state joins them."""
    path, frame = clicks
    p = pipeline(2, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "50"})
    result = (
        p.source(files(path))
        .key_by("user")
        .process(
            pages_per_user,
            schema="user string, pages array<string>, counts map<string, bigint>",
            state={"pages": ListState("string"), "counts": MapState("string", "int64")},
        )
        .to_pandas()
    )
    final = result.groupby("user").tail(1).set_index("user")  # a user's last emitted row has everything
    assert result.user.duplicated().any()  # some keys really were split over calls
    for user, rows in frame.groupby("user"):
        assert sorted(final.loc[user, "pages"]) == sorted(rows.page)
        assert dict(final.loc[user, "counts"]) == rows.page.value_counts().to_dict()


def count_visits(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    visits = state["visits"]
    seen = visits.get().fill_null(0).to_numpy(zero_copy_only=False)
    visit = np.arange(batch.data.num_rows) - batch.starts[batch.key_index] + 1 + seen[batch.key_index]
    visits.update(pa.array(seen + batch.counts))
    return pa.table({"n": batch.data.column("n"), "user": batch.data.column("user"), "visit": visit})


@pytest.mark.parametrize("parallelism", [1, 3])
def test_value_state_numbers_rows_across_calls_without_order(
    clicks: tuple[Path, pd.DataFrame], parallelism: int
) -> None:
    path, frame = clicks
    p = pipeline(parallelism, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "64"})
    result = (
        p.source(files(path))
        .key_by("user")
        .process(count_visits, schema="n long, user string, visit long", state={"visits": ValueState("int64")})
        .to_pandas()
    )
    assert sorted(result.n) == sorted(frame.n)
    for user, rows in result.groupby("user"):
        assert sorted(rows.visit) == list(range(1, (frame.user == user).sum() + 1))


def running_in_arrival_order(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    total, visits = state["total"], state["visits"]
    running = batch.running_sum(batch.data.column("price"), initial=total.get())
    seen = visits.get().fill_null(0).to_numpy(zero_copy_only=False)
    visit = np.arange(batch.data.num_rows) - batch.starts[batch.key_index] + 1 + seen[batch.key_index]
    total.update(pa.array(batch.last_per_key(running)))
    visits.update(pa.array(seen + batch.counts))
    return pa.table({"n": batch.data.column("n"), "user": batch.data.column("user"), "visit": visit,
                     "running": running})  # fmt: skip


@pytest.mark.parametrize("batch_rows", [7, 5_000])
def test_process_without_order_by_sees_each_keys_rows_in_arrival_order(
    clicks: tuple[Path, pd.DataFrame], tmp_path: Path, batch_rows: int
) -> None:
    """No sort anywhere: one file read by one task and keyed at parallelism 1 arrives in file
    order (n); small Arrow batches spread every key over many calls, each grouped by hashing.
    Each key's running sum and visit number are pandas' in n order, so grouping kept every key's
    rows in arrival order and state carried them across calls."""
    _, frame = clicks
    frame.to_parquet(tmp_path / "clicks.parquet", index=False, coerce_timestamps="us")
    p = pipeline(1, **FIXED, **{"spark.sql.execution.arrow.maxRecordsPerBatch": str(batch_rows)})
    result = (
        p.source(files(tmp_path), parallelism=1)
        .key_by("user")
        .process(
            running_in_arrival_order,
            schema="n long, user string, visit long, running double",
            state={"total": ValueState("float64"), "visits": ValueState("int64")},
        )
        .to_pandas()
        .sort_values("n", ignore_index=True)
    )
    expected = pd.DataFrame(
        {
            "n": frame.n,
            "user": frame.user,
            "visit": frame.groupby("user").cumcount() + 1,
            "running": frame.groupby("user").price.cumsum(),
        }
    )
    pd.testing.assert_frame_equal(result, expected, check_dtype=False, rtol=1e-9)


@pytest.mark.parametrize("parallelism", [2, 3])
def test_process_without_order_by_across_batches_and_partitions(
    clicks: tuple[Path, pd.DataFrame], parallelism: int
) -> None:
    """Keys spread over many Arrow batches and both source files (two map tasks): each key's
    visits are numbered 1..count and its running sums follow one order of its prices."""
    path, frame = clicks
    p = pipeline(parallelism, **FIXED, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "11"})
    stream = (
        p.source(files(path))
        .key_by("user")
        .process(
            running_in_arrival_order,
            schema="n long, user string, visit long, running double",
            state={"total": ValueState("float64"), "visits": ValueState("int64")},
        )
    )
    result = stream.to_pandas().sort_values(["user", "visit"], ignore_index=True)
    assert sorted(result.n) == list(frame.n)
    prices = frame.set_index("n").price
    for user, rows in result.groupby("user"):
        assert list(rows.visit) == list(range(1, (frame.user == user).sum() + 1))
        np.testing.assert_allclose(rows.running, np.cumsum(prices.loc[rows.n].to_numpy()), rtol=1e-9)
    plan = compile_plan(p.operators, (stream.node_id,), p.config)
    physical = FrameBuilder(spark_session(TEST_SPARK), plan).frame(stream.node_id)._jdf.queryExecution()
    assert "Sort " not in physical.executedPlan().toString()  # Spark sorts nothing


def test_process_without_order_by_groups_multi_column_float_keys_like_spark(tmp_path: Path) -> None:
    """NaN is one key and -0.0 is 0.0 (Spark's grouping), with a string key beside them."""
    rng = np.random.default_rng(5)
    values = rng.choice([0.0, -0.0, 1.5, np.nan], 3_000)
    tags = rng.choice(["a", "b"], 3_000)
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"k": pa.array(values, from_pandas=False), "tag": tags}), tmp_path / "x.parquet")
    p = pipeline(2, **FIXED, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "13"})
    result = (
        p.source(files(tmp_path))
        .key_by("k", "tag")
        .process(count_rows_by_tag, schema="k double, tag string, rows long", state={"rows": ValueState("int64")})
        .to_pandas()
    )
    final = result.groupby([result.k.fillna(-1), "tag"]).rows.max().to_dict()
    expected = pd.DataFrame({"k": np.nan_to_num(values + 0.0, nan=-1), "tag": tags}).value_counts().to_dict()
    assert final == expected


def count_rows_by_tag(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    seen = state["rows"]
    total = seen.get().fill_null(0).to_numpy(zero_copy_only=False) + batch.counts
    seen.update(pa.array(total))
    return pa.table({"k": batch.keys.column("k"), "tag": batch.keys.column("tag"), "rows": total})


def test_sinks_write_real_files(clicks: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    path, frame = clicks
    p = pipeline(2)
    per_page = p.source(files(path)).key_by("page").aggregate(clicks="count(*)")
    per_page.sink(parquet(tmp_path / "per_page"))
    from keyflow import csv, json

    per_page.sink(json(tmp_path / "per_page_json"))
    per_page.sink(csv(tmp_path / "per_page_csv"))
    result = p.run()
    expected = frame.groupby("page").size().sort_index()
    written = pd.read_parquet(tmp_path / "per_page").set_index("page").clicks.sort_index()
    assert written.to_dict() == expected.to_dict()
    from_json = pd.concat(pd.read_json(f, lines=True) for f in (tmp_path / "per_page_json").glob("*.json"))
    assert from_json.set_index("page").clicks.sort_index().to_dict() == expected.to_dict()
    from_csv = pd.concat(pd.read_csv(f) for f in (tmp_path / "per_page_csv").glob("*.csv"))
    assert from_csv.set_index("page").clicks.sort_index().to_dict() == expected.to_dict()
    assert [sink.rows for sink in result.sinks] == [3, 3, 3]
    (stage,) = result.stages  # one file per subtask, as many as auto-parallelism decided
    assert len(list((tmp_path / "per_page").glob("*.parquet"))) == stage.decision.parallelism


def count_rows(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    seen = state["rows"]
    total = seen.get().fill_null(0).to_numpy(zero_copy_only=False) + batch.counts
    seen.update(pa.array(total))
    return pa.table({"k": batch.keys.column("k"), "rows": total})


@pytest.mark.parametrize("order_by", [(), ("n",)])
def test_nan_keys_are_one_key_like_in_spark(tmp_path: Path, order_by: tuple[str, ...]) -> None:
    keys = np.where(np.arange(300) % 3 == 0, np.nan, np.arange(300) % 5).astype(float)
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"k": pa.array(keys, from_pandas=False), "n": np.arange(300)}), tmp_path / "x.parquet")
    p = pipeline(2, **{"spark.sql.execution.arrow.maxRecordsPerBatch": "7"})
    result = (
        p.source(files(tmp_path))
        .key_by("k")
        .process(count_rows, schema="k double, rows long", state={"rows": ValueState("int64")}, order_by=order_by)
        .to_pandas()
    )
    final = result.groupby(result.k.fillna(-1)).rows.max().to_dict()
    expected = pd.Series(keys).fillna(-1).value_counts().to_dict()
    assert final == expected


def test_csv_sink_counts_rows_as_written(tmp_path: Path) -> None:
    from keyflow import csv, datagen, sequence

    p = pipeline(3)
    rows = p.source(datagen(rows=100, fields={"n": sequence()})).with_columns(text="concat('line\\n', n)")
    rows.sink(csv(tmp_path / "plain", header="false"))
    result = p.run()
    assert result.sinks[0].rows == 100
