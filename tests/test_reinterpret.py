"""``reinterpret_as_keyed`` after a keyed operator: the next keyed operator runs in the same
Spark partitions with no exchange, and its results equal ``key_by``'s (and pandas')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import KeyedBatch, KeyedState, Pipeline, ValueState, parquet
from keyflow.errors import PipelineError, PlanError, RestoreError
from keyflow.plan.compile import compile_plan
from keyflow.runtime.frames import FrameBuilder
from keyflow.runtime.session import spark_session
from tests.pipelines import FIXED, TEST_SPARK, write_clicks


def running_clicks(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Per user: clicks so far plus this row's count (state across calls)."""
    total = state["total"]
    running = batch.running_sum(batch.data.column("clicks"), total.get())
    total.update(batch.last_per_key(running))
    return pa.table({"user": batch.keys.column("user"), "total": pa.array(batch.last_per_key(running))})


def per_user(p: Pipeline, path: Path) -> object:
    from keyflow import files

    return p.source(files(path)).key_by("user").aggregate(clicks="count(*)", revenue="sum(price)")


@pytest.mark.jvm
@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_results_equal_key_by_and_pandas(tmp_path: Path, parallelism: int) -> None:
    clicks = write_clicks(tmp_path / "clicks", rows=6_000, users=250)
    expected = clicks.groupby("user").agg(clicks=("price", "size"), revenue=("price", "sum")).reset_index()
    for how in ("reinterpret", "key_by"):
        p = Pipeline(parallelism=parallelism, config=TEST_SPARK)
        counted = per_user(p, tmp_path / "clicks")
        keyed = counted.reinterpret_as_keyed("user") if how == "reinterpret" else counted.key_by("user")
        keyed.aggregate(top="max(revenue)", n="sum(clicks)").sink(parquet(str(tmp_path / f"agg-{how}")))
        keyed.process(running_clicks, "user string, total long", state={"total": ValueState("int64")}).sink(
            parquet(str(tmp_path / f"process-{how}"))
        )
        p.run()
    for name, column, want in (("agg", "n", "clicks"), ("process", "total", "clicks")):
        got = {how: pd.read_parquet(tmp_path / f"{name}-{how}").sort_values("user").reset_index(drop=True)
               for how in ("reinterpret", "key_by")}  # fmt: skip
        pd.testing.assert_frame_equal(got["reinterpret"], got["key_by"], check_dtype=False)
        assert got["reinterpret"][column].tolist() == expected.sort_values("user")[want].tolist()


@pytest.mark.jvm
def test_the_keyed_operator_after_it_has_no_exchange(tmp_path: Path) -> None:
    """The plan shows a forward edge (one vertex), and Spark's physical plan of the second
    keyed operator adds no shuffle to the first one's."""
    write_clicks(tmp_path / "clicks", rows=2_000, users=50)
    p = Pipeline(parallelism=2, config=TEST_SPARK)
    counted = per_user(p, tmp_path / "clicks")
    second = counted.reinterpret_as_keyed("user").process(
        running_clicks, "user string, total long", state={"total": ValueState("int64")}
    )
    graph = p.plan()
    assert [e.partitioner.value for e in graph.edges] == ["hash"]  # source -> aggregate only
    assert any("aggregate" in v.name and "running_clicks" in v.name for v in graph.vertices)
    plan = compile_plan(p.operators, (second.node_id,), p.config)
    builder = FrameBuilder(spark_session({"spark.master": "local[2]"}), plan)
    exchanges = {node_id: _exchanges(builder.frame(node_id)) for node_id in (counted.node_id, second.node_id)}
    assert exchanges[second.node_id] == exchanges[counted.node_id]


def _exchanges(frame: object) -> int:
    physical = frame._jdf.queryExecution().executedPlan().toString()  # type: ignore[attr-defined]
    return physical.count("Exchange ")


@pytest.mark.jvm
def test_rows_not_keyed_as_declared_stop_the_job(tmp_path: Path) -> None:
    """A process function that rewrites the key column breaks the declaration: caught."""
    write_clicks(tmp_path / "clicks", rows=2_000, users=50)

    def rename_users(batch: KeyedBatch, state: KeyedState) -> pa.Table:
        users = np.char.add("other-", np.asarray(batch.keys.column("user").to_pylist(), dtype=str))
        return pa.table({"user": users.tolist(), "clicks": batch.last_per_key(batch.data.column("clicks"))})

    # At parallelism 2 fixed: one subtask (what auto-parallelism decides for so little) owns every key group.
    p = Pipeline(parallelism=2, config={**TEST_SPARK, **FIXED})
    renamed = per_user(p, tmp_path / "clicks").key_by("user").process(rename_users, "user string, clicks long")
    renamed.reinterpret_as_keyed("user").aggregate(n="sum(clicks)").sink(parquet(str(tmp_path / "out")))
    with pytest.raises(PipelineError, match=r"row\(s\) of other subtasks' key groups, e.g. key \{'user': 'other-.*"
                       r"the stream is not keyed by \['user'\] as reinterpret_as_keyed declared"):  # fmt: skip
        p.run()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda s: s.reinterpret_as_keyed("user"),
            r"source 'source: files \(parquet\)' has no splits partitioned by key \(log\(\.\.\.\) has\); use key_by",
        ),
        (
            lambda s: s.key_by("user").aggregate(n="count(*)").select("user", "n").reinterpret_as_keyed("user"),
            r"select 'select' may change the key columns; reinterpret_as_keyed follows a keyed operator",
        ),
        (
            lambda s: s.key_by("user", "page").aggregate(n="count(*)").reinterpret_as_keyed("user"),
            r"'aggregate' is keyed by \['user', 'page'\]; reinterpret on the same keys, or use key_by",
        ),
        (
            lambda s: (
                s.key_by("user").aggregate(n="count(*)").filter("n > 0", parallelism=3).reinterpret_as_keyed("user")
            ),
            r"filter 'filter' before it runs at 3 and rebalances the rows; give it the same parallelism, or use key_by",
        ),
        (
            lambda s: s.key_by("user").aggregate(n="count(*)").set_parallelism(3).reinterpret_as_keyed("user"),
            r"at parallelism 2, but 'aggregate' runs at 3: its key groups would move between subtasks",
        ),
    ],
)
def test_a_wrong_reinterpret_is_a_plan_error(tmp_path: Path, build: object, message: str) -> None:
    from keyflow import files

    p = Pipeline(parallelism=2, config=TEST_SPARK)
    keyed = build(p.source(files(tmp_path)))  # type: ignore[operator]
    keyed.aggregate(m="count(*)").sink(parquet(str(tmp_path / "out")))
    with pytest.raises(PlanError, match=message):
        p.plan()


def row_number(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Per user, the number of this row among the user's rows so far (rows ordered by seq)."""
    seen = state["seen"]
    numbers = batch.running_sum(np.ones(batch.data.num_rows, dtype=np.int64), seen.get())
    seen.update(batch.last_per_key(numbers))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "number": numbers})


def streaming_pipeline(base: Path, parallelism: int) -> Pipeline:
    from keyflow import log
    from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, config, running_total

    p = Pipeline(config=config(parallelism))
    totals = (
        p.source(log(str(base / "log"), rows_per_batch=500))
        .key_by("user")
        .process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq")
    )
    totals.reinterpret_as_keyed("user").process(
        row_number, "user string, seq long, number long", state={"seen": ValueState("int64")}, order_by="seq"
    ).sink(parquet(str(base / "out")))
    return p


@pytest.mark.jvm
def test_streaming_restart_and_live_rescale_keep_the_state_of_both_operators(tmp_path: Path) -> None:
    from tests.streams import append, events, read_output

    history = [events(1_200, 80, start=i * 1_200, seed=20 + i) for i in range(3)]
    append(tmp_path / "log", history[0])
    streaming_pipeline(tmp_path, 2).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    append(tmp_path / "log", history[1])
    job = streaming_pipeline(tmp_path, 3).start(checkpoint=str(tmp_path / "ckpt"))  # restart at 3
    try:
        job.process_all_available()
        job.rescale(1, reason="test")  # live
        append(tmp_path / "log", history[2])
        job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 1
    finally:
        job.stop()
    everything = pd.concat(history).sort_values("seq")
    expected = everything.assign(number=everything.groupby("user").cumcount() + 1)[["user", "seq", "number"]]
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.reset_index(drop=True), check_dtype=False)


def totals_then_aggregate(base: Path, how: str) -> Pipeline:
    from keyflow import log
    from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, config, running_total

    p = Pipeline(config=config(2))
    totals = (
        p.source(log(str(base / "log"), rows_per_batch=400))
        .key_by("user")
        .process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq")
    )
    keyed = totals.reinterpret_as_keyed("user") if how == "reinterpret" else totals.key_by("user")
    keyed.aggregate(top="max(total)", n="count(*)").sink(parquet(str(base / f"out-{how}")))
    return p


@pytest.mark.jvm
def test_streaming_aggregate_after_it_emits_what_key_by_emits(tmp_path: Path) -> None:
    """Per micro-batch, every key the batch touched with its running values (changed or not)."""
    from tests.streams import append, events, read_output

    append(tmp_path / "log", events(1_600, 40, start=0, seed=31))
    outputs = {}
    for how in ("reinterpret", "key_by"):
        totals_then_aggregate(tmp_path, how).run(checkpoint=str(tmp_path / f"ckpt-{how}"), available_now=True)
        outputs[how] = read_output(tmp_path / f"out-{how}").sort_values(["user", "n", "top"]).reset_index(drop=True)
    assert len(outputs["key_by"]) > 40  # several micro-batches, keys repeated
    pd.testing.assert_frame_equal(outputs["reinterpret"], outputs["key_by"], check_dtype=False)

    with pytest.raises(RestoreError, match=r"operator 'aggregate' \(uid 'aggregate\[user\]'\) cannot restore its state "
                       r"from checkpoint .*: it now keeps its state as running partials, the checkpoint as merged "
                       r"partials\. Change it back"):  # fmt: skip
        totals_then_aggregate(tmp_path, "reinterpret").run(checkpoint=str(tmp_path / "ckpt-key_by"), available_now=True)


@pytest.mark.jvm
def test_null_keys_and_unsupported_aggregates_after_it(tmp_path: Path) -> None:
    write_clicks(tmp_path / "clicks", rows=1_000, users=30)

    def null_some_users(batch: KeyedBatch, state: KeyedState) -> pa.Table:
        users = batch.keys.column("user").to_pylist()
        return pa.table({"user": [None if i % 3 == 0 else u for i, u in enumerate(users)], "clicks": [1] * len(users)})

    p = Pipeline(parallelism=2, config=TEST_SPARK)
    nulls = per_user(p, tmp_path / "clicks").key_by("user").process(null_some_users, "user string, clicks long")
    nulls.reinterpret_as_keyed("user").aggregate(n="sum(clicks)").sink(parquet(str(tmp_path / "out")))
    with pytest.raises(PipelineError, match=r"have a null in key column\(s\) \['user'\]"):
        p.run()

    q = Pipeline(parallelism=2, config=TEST_SPARK)
    per_user(q, tmp_path / "clicks").reinterpret_as_keyed("user").aggregate(s="stddev(revenue)").sink(
        parquet(str(tmp_path / "out2"))
    )
    with pytest.raises(PlanError, match=r"aggregate s='stddev\(revenue\)' is not supported after reinterpret_as_keyed"
                       r" \(it runs in the worker; use key_by for others\)"):  # fmt: skip
        q.run()
