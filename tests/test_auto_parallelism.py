"""Adaptive batch parallelism on Spark: each keyed stage sized from the bytes its input wrote
to the shuffle, subtasks reading contiguous key-group ranges. Answers from pandas, key groups
from keyflow's NumPy copy of Spark's hash, bytes from Spark's own stage metrics."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import KeyedBatch, KeyedState, Pipeline, PlanError, ValueState, files, parquet
from keyflow.errors import ConfigError
from keyflow.keygroups import assign_to_key_groups
from keyflow.runtime.executor import RunResult
from tests.pipelines import TEST_SPARK

AUTO = "execution.batch.adaptive.auto-parallelism."


def write_events(path: Path, rows: int, keys: int, zipf: float | None, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    drawn = (rng.zipf(zipf, rows) - 1) % keys if zipf else rng.integers(0, keys, rows)
    frame = pd.DataFrame({"key": drawn.astype(np.int64), "amount": rng.integers(1, 100, rows), "seq": np.arange(rows)})
    path.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path / "part-0.parquet", index=False)
    return frame


def running_total(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    total = state["total"]
    running = batch.running_sum(batch.data.column("amount"), total.get())
    total.update(batch.last_per_key(running))
    return pa.table({"key": batch.data.column("key"), "seq": batch.data.column("seq"), "total": running})


def where(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each key once per call, with the subtask and key group it was processed in."""
    return pa.table(
        {
            "key": batch.keys.column("key"),
            "subtask": pa.array(np.full(batch.num_keys, batch.subtask, dtype=np.int32)),
            "key_group": pa.array(batch.key_groups),
        }
    )


def run(tmp_path: Path, config: dict[str, object], build: object) -> RunResult:
    p = Pipeline(config={**TEST_SPARK, **config})
    build(p.source(files(str(tmp_path / "in"))))  # type: ignore[operator]
    result = p.run()
    assert isinstance(result, RunResult)
    return result


@pytest.mark.jvm
@pytest.mark.parametrize("zipf", [None, 1.3], ids=["uniform", "zipf"])
def test_results_equal_pandas_with_auto_parallelism(tmp_path: Path, zipf: float | None) -> None:
    events = write_events(tmp_path / "in", 60_000, 2_000, zipf)

    def build(source: object) -> None:
        keyed = source.key_by("key")  # type: ignore[attr-defined]
        keyed.aggregate(n="count(*)", amount="sum(amount)").sink(parquet(str(tmp_path / "sums")))
        state = {"total": ValueState("int64")}
        keyed.process(running_total, "key long, seq long, total long", state=state, order_by="seq").sink(
            parquet(str(tmp_path / "totals"))
        )

    result = run(tmp_path, {AUTO + "avg-data-volume-per-task": "64kb", AUTO + "max-parallelism": 4}, build)
    assert [stage.decision.parallelism for stage in result.stages] == [
        min(4, math.ceil(stage.decision.input_bytes / 65536)) for stage in result.stages
    ]
    assert result.stages[1].decision.parallelism == 4  # the process reads every row: > 4 x 64 KiB
    # Rows per subtask (Spark's task metrics) against the events whose key group, recomputed
    # with keyflow's NumPy copy of Spark's hash, lies in the subtask's reported range.
    groups = assign_to_key_groups(events["key"].to_numpy(), 27720, hash="spark")
    process = result.stages[1]
    assert process.subtask_rows == tuple(
        int(((groups >= first) & (groups <= last)).sum()) for first, last in process.key_groups
    )
    sums = pd.read_parquet(tmp_path / "sums").sort_values("key").reset_index(drop=True)
    want = events.groupby("key").agg(n=("amount", "size"), amount=("amount", "sum")).reset_index()
    pd.testing.assert_frame_equal(sums, want, check_dtype=False)
    totals = pd.read_parquet(tmp_path / "totals").sort_values("seq").reset_index(drop=True)
    ordered = events.sort_values("seq")
    assert (totals["total"].to_numpy() == ordered.groupby("key")["amount"].cumsum().to_numpy()).all()


@pytest.mark.jvm
def test_decided_parallelism_grows_with_input_as_the_formula_says(tmp_path: Path) -> None:
    """The same job over a small and a 16x larger input: P = ceil(bytes / V) grows with it;
    the bytes the decision used are those Spark's shuffle wrote."""
    decided = []
    for rows in (2_500, 40_000):
        write_events(tmp_path / "in", rows, 1_000_000, None, seed=rows)
        result = run(
            tmp_path,
            {AUTO + "avg-data-volume-per-task": "32kb", AUTO + "max-parallelism": 40},
            lambda s, rows=rows: (
                s.key_by("key")
                .process(where, "key long, subtask int, key_group int")
                .sink(parquet(str(tmp_path / f"out-{rows}")))
            ),
        )
        (stage,) = result.stages
        assert stage.rows == rows
        assert stage.decision.parallelism == math.ceil(stage.decision.input_bytes / 32_768)
        decided.append((stage.decision.input_bytes, stage.decision.parallelism))
    (small, p_small), (large, p_large) = decided
    # 16x the rows: ~16x the bytes, less the per-block framing (~100 bytes each) of the small run
    assert 6 * small < large < 16 * small
    assert 4 * p_small <= p_large


@pytest.mark.jvm
def test_each_subtask_receives_exactly_its_reported_key_group_range(tmp_path: Path) -> None:
    write_events(tmp_path / "in", 30_000, 5_000, 1.2)
    result = run(
        tmp_path,
        {AUTO + "avg-data-volume-per-task": "32kb", AUTO + "max-parallelism": 5},
        lambda s: (
            s.key_by("key")
            .process(where, "key long, subtask int, key_group int")
            .sink(parquet(str(tmp_path / "where")))
        ),
    )
    (stage,) = result.stages
    seen = pd.read_parquet(tmp_path / "where")
    assert sorted(seen["subtask"].unique()) == list(range(stage.decision.parallelism))
    expected = assign_to_key_groups(seen["key"].to_numpy(), 27720, hash="spark")
    assert (seen["key_group"].to_numpy() == expected).all()
    for subtask, (first, last) in enumerate(stage.key_groups):
        groups = seen.loc[seen["subtask"] == subtask, "key_group"]
        assert groups.between(first, last).all()
    assert stage.key_groups[0][0] == 0
    assert stage.key_groups[-1][1] == 27719
    assert all(a[1] + 1 == b[0] for a, b in zip(stage.key_groups, stage.key_groups[1:], strict=False))


@pytest.mark.jvm
def test_explicit_parallelism_is_kept_and_reinterpret_follows_the_decided_ranges(tmp_path: Path) -> None:
    events = write_events(tmp_path / "in", 20_000, 500, None)

    def build(source: object) -> None:
        fixed = source.key_by("key").process(where, "key long, subtask int, key_group int", name="fixed")  # type: ignore[attr-defined]
        fixed.set_parallelism(3).sink(parquet(str(tmp_path / "fixed")))
        auto = source.key_by("key").aggregate(m="count(*)").set_name("auto")  # type: ignore[attr-defined]
        auto.reinterpret_as_keyed("key").process(where, "key long, subtask int, key_group int").sink(
            parquet(str(tmp_path / "where"))
        )

    result = run(tmp_path, {AUTO + "avg-data-volume-per-task": "1kb", AUTO + "max-parallelism": 2}, build)
    assert [stage.operator for stage in result.stages] == ["auto"]
    fixed = pd.read_parquet(tmp_path / "fixed")
    assert sorted(fixed["subtask"].unique()) == [0, 1, 2]
    assert set(fixed["key"]) == set(events["key"])
    (stage,) = result.stages
    seen = pd.read_parquet(tmp_path / "where")
    for subtask, (first, last) in enumerate(stage.key_groups):
        assert seen.loc[seen["subtask"] == subtask, "key_group"].between(first, last).all()
    assert set(seen["key"]) == set(events["key"])


@pytest.mark.jvm
def test_auto_parallelism_off_runs_at_the_default_parallelism(tmp_path: Path) -> None:
    write_events(tmp_path / "in", 5_000, 100, None)
    result = run(
        tmp_path,
        {AUTO + "enabled": "false", "parallelism.default": 3},
        lambda s: s.key_by("key").aggregate(n="count(*)").sink(parquet(str(tmp_path / "out"))),
    )
    assert result.stages == []
    assert len(list((tmp_path / "out").glob("part-*"))) == 3


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("enabled", "yes", r"execution.batch.adaptive.auto-parallelism.enabled='yes' is invalid; use true or false"),
        ("min-parallelism", 0, r"auto-parallelism.min-parallelism=0 is invalid; it must be a positive integer"),
        ("max-parallelism", 40_000, r"auto-parallelism.max-parallelism=40000 is invalid; it must be between 1 and"),
        ("avg-data-volume-per-task", "16 parsecs", r"avg-data-volume-per-task='16 parsecs' is not a positive size"),
        ("avg-data-volume-per-task", "0mb", r"avg-data-volume-per-task='0mb' is not a positive size"),
        ("default-source-parallelism", -1, r"default-source-parallelism=-1 is invalid"),
        ("max-broadcast-ratio", "1.5", r"max-broadcast-ratio='1.5' is invalid; it must be a number in \[0, 1\)"),
        ("balance", "fair", r"auto-parallelism.balance='fair' is invalid; choose one of bytes, even"),
    ],
)
def test_invalid_options_are_clear_errors(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Pipeline(config={AUTO + key: value})


@pytest.mark.jvm
def test_min_above_the_default_bound_says_where_the_bound_comes_from(tmp_path: Path) -> None:
    write_events(tmp_path / "in", 100, 10, None)
    with pytest.raises(
        ConfigError,
        match=r"auto-parallelism.min-parallelism=3 is above the upper bound 2 \(Spark's task slots, as "
        r"execution.batch.adaptive.auto-parallelism.max-parallelism is not set\); lower min-parallelism or set",
    ):
        run(tmp_path, {AUTO + "min-parallelism": 3},
            lambda s: s.key_by("key").aggregate(n="count(*)").sink(parquet(str(tmp_path / "out"))))  # fmt: skip


@pytest.mark.jvm
def test_an_operator_after_a_decided_stage_keeps_its_own_parallelism(tmp_path: Path) -> None:
    """The plan saw a forward edge (both at the default 3); the stage was decided at 1, the
    sink with parallelism=3 of its own still writes 3 files, the one without follows with 1."""
    events = write_events(tmp_path / "in", 3_000, 50, None)

    def build(source: object) -> None:
        counted = source.key_by("key").aggregate(n="count(*)")  # type: ignore[attr-defined]
        counted.sink(parquet(str(tmp_path / "own")), parallelism=3)
        counted.sink(parquet(str(tmp_path / "follows")))

    result = run(tmp_path, {"parallelism.default": 3}, build)
    assert [stage.decision.parallelism for stage in result.stages] == [1]
    assert len(list((tmp_path / "own").glob("part-*"))) == 3
    assert len(list((tmp_path / "follows").glob("part-*"))) == 1
    own = pd.read_parquet(tmp_path / "own").sort_values("key").reset_index(drop=True)
    assert (own["n"].to_numpy() == events.groupby("key").size().to_numpy()).all()


@pytest.mark.jvm
def test_two_decided_stages_in_a_row_and_collect(tmp_path: Path) -> None:
    """key_by -> process -> key_by (another key) -> aggregate, collected with to_pandas()."""
    events = write_events(tmp_path / "in", 30_000, 400, 1.3)
    p = Pipeline(config={**TEST_SPARK, AUTO + "avg-data-volume-per-task": "32kb"})
    totals = (
        p.source(files(str(tmp_path / "in")))
        .key_by("key")
        .process(running_total, "key long, seq long, total long", state={"total": ValueState("int64")}, order_by="seq")
    )
    got = totals.with_columns(bucket="total % 7").key_by("bucket").aggregate(n="count(*)").to_pandas()
    ordered = events.sort_values("seq")
    want = (ordered.groupby("key")["amount"].cumsum() % 7).value_counts()
    assert dict(zip(got["bucket"], got["n"], strict=True)) == want.to_dict()


@pytest.mark.jvm
def test_an_empty_input_spark_knows_of_runs_with_one_subtask(tmp_path: Path) -> None:
    write_events(tmp_path / "in", 100, 10, None)
    result = run(
        tmp_path,
        {},
        lambda s: (
            s.filter("false")
            .key_by("key")
            .process(where, "key long, subtask int, key_group int")
            .sink(parquet(str(tmp_path / "out")))
        ),
    )
    (stage,) = result.stages
    assert (stage.decision.parallelism, stage.decision.reason, stage.rows) == (1, "empty input", 0)
    assert stage.key_groups == ((0, 27719),)


@pytest.mark.jvm
def test_even_balance_and_default_source_parallelism_on_spark(tmp_path: Path) -> None:
    events = write_events(tmp_path / "in", 20_000, 3_000, 1.2)
    result = run(
        tmp_path,
        {
            AUTO + "balance": "even",
            AUTO + "avg-data-volume-per-task": "16kb",
            AUTO + "max-parallelism": 4,
            AUTO + "default-source-parallelism": 1,
        },
        lambda s: (
            s.key_by("key")
            .process(where, "key long, subtask int, key_group int")
            .sink(parquet(str(tmp_path / "where")))
        ),
    )
    (stage,) = result.stages
    assert stage.decision.ranges == tuple(
        (stage.subpartitions * k // 4, stage.subpartitions * (k + 1) // 4 - 1) for k in range(4)
    )
    assert result.parallelism[1] == 1  # the source read at default-source-parallelism
    seen = pd.read_parquet(tmp_path / "where")
    assert set(seen["key"]) == set(events["key"])


def test_min_above_max_is_a_clear_error_naming_both(tmp_path: Path) -> None:
    """Found when the plan is built: no Spark (this test may not start a JVM)."""
    write_events(tmp_path / "in", 100, 10, None)
    p = Pipeline(config={**TEST_SPARK, AUTO + "min-parallelism": 3, AUTO + "max-parallelism": 2})
    p.source(files(str(tmp_path / "in"))).key_by("key").aggregate(n="count(*)").sink(parquet(str(tmp_path / "out")))
    with pytest.raises(
        PlanError,
        match=r"execution.batch.adaptive.auto-parallelism.min-parallelism=3 must be between 1 and "
        r"max-parallelism=2; lower min-parallelism or raise max-parallelism",
    ):
        p.plan()


@pytest.mark.jvm
def test_a_broadcast_side_input_reaches_every_subtask_and_enters_the_formula(tmp_path: Path) -> None:
    """Prices per key as a small side stream: every subtask gets the whole table; its bytes
    count as broadcast (capped at max-broadcast-ratio x the volume per task)."""
    events = write_events(tmp_path / "in", 20_000, 300, None)
    prices = pd.DataFrame({"key": np.arange(300, dtype=np.int64), "price": np.arange(300, dtype=np.int64) * 3})
    (tmp_path / "prices").mkdir()
    prices.to_parquet(tmp_path / "prices" / "part-0.parquet", index=False)

    def priced(batch: KeyedBatch, state: KeyedState, side: pa.Table) -> pa.Table:
        assert side.num_rows == 300  # whole, in every subtask
        lookup = side.to_pandas().set_index("key")["price"]
        keys = batch.data.column("key").to_pandas()
        value = batch.data.column("amount").to_numpy() * lookup.reindex(keys).to_numpy()
        return pa.table({"seq": batch.data.column("seq"), "value": value, "subtask": np.full(len(keys), batch.subtask)})

    p = Pipeline(config={**TEST_SPARK, AUTO + "avg-data-volume-per-task": "64kb", AUTO + "max-parallelism": 8})
    side = p.source(files(str(tmp_path / "prices"))).broadcast()
    p.source(files(str(tmp_path / "in"))).key_by("key").process(
        priced, "seq long, value long, subtask long", side=side
    ).sink(parquet(str(tmp_path / "out")))
    edges = {edge.partitioner.value for edge in p.plan().edges}
    assert "broadcast" in edges
    result = p.run()
    assert isinstance(result, RunResult)
    (stage,) = result.stages
    side_bytes = pa.Table.from_pandas(prices, preserve_index=False).nbytes
    assert stage.decision.broadcast_bytes == side_bytes
    counted = min(side_bytes, 32 * 1024)
    assert stage.decision.counted_broadcast_bytes == counted
    assert stage.decision.formula_parallelism == math.ceil(stage.decision.input_bytes / (65536 - counted))
    got = pd.read_parquet(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    want = events.merge(prices, on="key").sort_values("seq")
    assert (got["value"].to_numpy() == (want["amount"] * want["price"]).to_numpy()).all()
    assert got["subtask"].nunique() == stage.decision.parallelism > 1


def test_a_side_input_must_be_a_broadcast_stream_of_the_same_pipeline(tmp_path: Path) -> None:
    from keyflow.errors import PlanError

    p, other = Pipeline(config=TEST_SPARK), Pipeline(config=TEST_SPARK)
    keyed = p.source(files(str(tmp_path))).key_by("key")
    with pytest.raises(PlanError, match=r"side= takes a broadcast stream \(stream.broadcast\(\)\)"):
        keyed.process(where, "key long", side=p.source(files(str(tmp_path))))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"side= is a stream of another pipeline"):
        keyed.process(where, "key long", side=other.source(files(str(tmp_path))).broadcast())
