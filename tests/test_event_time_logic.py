"""Event time without Spark: watermark generation, timers, state TTL, session merging and the
window functions driven through the real ``KeyedRunner``, and the plan errors before Spark."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from keyflow import (
    ListState,
    Log,
    Pipeline,
    StateTtlConfig,
    ValueState,
    WatermarkStrategy,
    files,
    log,
    parquet,
    session,
    sliding,
    tumbling,
)
from keyflow.cli.app import app
from keyflow.errors import PlanError, WorkerError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.aggregates import parse_aggregations
from keyflow.plan.descriptors import with_ttl_columns
from keyflow.plan.durations import duration
from keyflow.plan.event_time import END_OF_INPUT, EVENT_TIME, NO_WATERMARK, PROCESSING_TIME, timer_state
from keyflow.runtime.windows import END_MICROS, START_MICROS, SessionMerge, WindowMerge, _merge_sessions
from keyflow.runtime.workers import KeyedRunner, KeyedTask, TimedUserProcess
from keyflow.state.durable import MemoryState
from keyflow.state.keyed import ListStateView, ValueStateView, expire
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime, TimerService, pop_due
from keyflow.state.watermarks import SourceWatermark

STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness("ts", "10 s")


# -- watermarks ------------------------------------------------------------------------------
def test_the_watermark_is_the_smallest_split_watermark_minus_the_bound_minus_one() -> None:
    mark = SourceWatermark().advance(STRATEGY, 2, {0: 100_000_000, 1: 40_000_000}, now=0.0)
    assert mark.watermark == 40_000_000 - 10_000_000 - 1
    later = mark.advance(STRATEGY, 2, {1: 90_000_000}, now=1.0)  # split 0 keeps its 100 s
    assert later.watermark == 90_000_000 - 10_000_000 - 1


def test_a_split_without_rows_holds_the_watermark_back_until_it_is_idle() -> None:
    """As Flink: without idleness a split that has no rows holds it (forever); with idleness it
    stops holding after the timeout of processing time, and holds again when rows come."""
    assert SourceWatermark().advance(STRATEGY, 2, {0: 100_000_000}, now=0.0).watermark == NO_WATERMARK
    idle = STRATEGY.with_idleness("5 s")
    mark = SourceWatermark().advance(idle, 2, {0: 100_000_000}, now=0.0)
    assert mark.watermark == NO_WATERMARK  # split 1 was seen just now: not idle yet
    mark = mark.advance(idle, 2, {0: 200_000_000}, now=6.0)
    assert mark.watermark == 200_000_000 - 10_000_001
    assert mark.idle_splits(idle, now=6.0) == [1]
    back = mark.advance(idle, 2, {1: 150_000_000}, now=7.0)  # the idle split has rows again: it holds
    assert back.watermark == 200_000_000 - 10_000_001  # ... but the watermark never goes back
    assert back.advance(idle, 2, {0: 300_000_000, 1: 250_000_000}, now=8.0).watermark == 250_000_000 - 10_000_001


def test_when_every_split_is_idle_the_watermark_stays_and_it_round_trips_the_manifest() -> None:
    idle = STRATEGY.with_idleness(timedelta(seconds=1))
    mark = SourceWatermark().advance(idle, 1, {0: 50_000_000}, now=0.0).advance(idle, 1, {}, now=10.0)
    assert mark.watermark == 50_000_000 - 10_000_001
    assert SourceWatermark.from_dict(mark.to_dict()) == mark
    assert SourceWatermark.from_dict(None) == SourceWatermark()


def test_idleness_starts_over_after_a_restart() -> None:
    """The time a job was down is not idleness (Flink does not checkpoint its idleness timers)."""
    idle = STRATEGY.with_idleness("60 s")
    mark = SourceWatermark().advance(idle, 2, {0: 100_000_000, 1: 100_000_000}, now=0.0)
    resumed = mark.advance(idle, 2, {0: 3_600_000_000}, now=300.0, restarted=True)
    assert resumed.watermark == mark.watermark  # split 1 holds it: it may still have rows
    assert resumed.advance(idle, 2, {0: 3_700_000_000}, now=361.0).watermark == 3_700_000_000 - 10_000_001


def test_splits_added_while_running_join_the_minimum() -> None:
    mark = SourceWatermark().advance(STRATEGY, 1, {0: 100_000_000}, now=0.0)
    assert mark.advance(STRATEGY, 2, {0: 120_000_000}, now=1.0).watermark == mark.watermark  # split 1: no rows


def test_an_operator_runs_at_the_earliest_of_its_sources_leaving_idle_ones_out() -> None:
    """Flink's rule for several inputs: the minimum watermark, over the inputs that are not
    idle (all idle: the minimum of all); a source without watermarks holds it back."""
    a, b = TaskTime(100, 200, 7), TaskTime(50, 90, 7)
    assert TaskTime.earliest([a, b]) == TaskTime(50, 90, 7)
    idle_b = TaskTime(50, 90, 7, idle=True)
    assert TaskTime.earliest([a, idle_b]) == a
    assert TaskTime.earliest([TaskTime(100, 200, 7, idle=True), idle_b]) == TaskTime(50, 90, 7, idle=True)
    assert TaskTime.earliest([a, TaskTime(NO_WATERMARK, NO_WATERMARK, 7)]).watermark == NO_WATERMARK


# -- timers ----------------------------------------------------------------------------------
def store_with(keys: list[str], state: dict | None = None) -> tuple[KeyedStateStore, np.ndarray]:  # type: ignore[type-arg]
    store = KeyedStateStore({**(state or {}), **timer_state()})
    slots = store.slots(pa.table({"k": keys}), np.zeros(len(keys), dtype=np.int32))
    store.take_touched()
    return store, slots


def test_timers_register_delete_and_fire_once_per_key_and_timestamp_in_order() -> None:
    store, slots = store_with(["a", "b", "c"])
    timers = TimerService(store, slots, TaskTime(NO_WATERMARK, 100, 0))
    timers.register_event_time_timer([50, 10, 200])
    timers.register_event_time_timer([5, 5, 50, 20], key_index=[0, 0, 0, 1])  # (a, 50) twice: one timer
    timers.delete_event_time_timer([10], key_index=[1])
    rounds = []
    while len(fired := pop_due(store, EVENT_TIME, 100)[0]):
        rounds.append(store.keys(fired).column("k").to_pylist())
    assert rounds == [["a", "b"], ["a"]]  # a@5 b@20, then a@50; c@200 waits; b@10 was deleted
    assert store.touched().tolist() == [0, 1]  # the removals are written with the batch
    remaining = store.columns["__event_time_timers"].get(slots).to_pylist()
    assert remaining == [None, None, [200]]


def test_timers_fire_in_timestamp_order_across_keys() -> None:
    store, slots = store_with(["A", "B"])
    TimerService(store, slots, TaskTime(NO_WATERMARK, 0, 0)).register_event_time_timer(
        [10, 12, 15], key_index=[0, 0, 1]
    )
    fired = []
    while len((due := pop_due(store, EVENT_TIME, 100))[0]):
        fired += list(zip(store.keys(due[0]).column("k").to_pylist(), due[1].tolist(), strict=True))
    assert fired == [("A", 10), ("A", 12), ("B", 15)]


def test_on_timer_that_keeps_registering_due_timers_stops_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer registered at or before the time it fires at fires again in the next round (as in
    Flink); an on_timer that always does so is stopped after MAX_ROUNDS, not left looping."""
    monkeypatch.setattr(TimedUserProcess, "MAX_ROUNDS", 5)
    fired: list[int] = []

    def on_timer(timers, state):  # type: ignore[no-untyped-def]
        fired.append(timers.timestamps[0].value)
        state.timers.register_event_time_timer([timers.timestamps[0].value])  # due again at once
        return pa.table({"k": timers.keys.column("k")})

    def register(batch, state):  # type: ignore[no-untyped-def]
        state.timers.register_event_time_timer([10] * batch.num_keys)
        return pa.table({"k": batch.keys.column("k")})

    process = TimedUserProcess(register, on_timer, "process 'p'")
    with pytest.raises(WorkerError) as raised:
        run_keyed(process, ("k",), pa.schema([("k", pa.string())]), timer_state(), [pa.table({"k": ["a"]})],
                  TaskTime(NO_WATERMARK, 100, 0))  # fmt: skip
    message = str(raised.value)
    assert "process 'p': 5 rounds of event time timers in one micro-batch" in message
    assert "register later timers (e.g. timestamp + interval)" in message
    assert fired == [10] * 5


def test_timers_of_one_key_fire_in_timestamp_order_across_rounds() -> None:
    store, slots = store_with(["a"])
    TimerService(store, slots, TaskTime(NO_WATERMARK, 0, 0)).register_event_time_timer(
        [30, 10, 20], key_index=[0, 0, 0]
    )
    fired = [int(pop_due(store, EVENT_TIME, 25)[1][0]) for _ in range(2)]
    assert fired == [10, 20]
    assert len(pop_due(store, EVENT_TIME, 25)[0]) == 0  # 30 is not due


def test_processing_time_timers_fire_by_the_clock_and_all_at_the_end_of_input() -> None:
    store, slots = store_with(["a", "b"])
    TimerService(store, slots, TaskTime(NO_WATERMARK, 0, 0)).register_processing_time_timer(
        pd.to_datetime(["2024-01-01 00:00:01", "2030-01-01 00:00:00"], utc=True)
    )
    now = int(pd.Timestamp("2025-01-01", tz="UTC").value // 1000)
    assert TaskTime(0, 0, now).until(PROCESSING_TIME) == now
    assert store.keys(pop_due(store, PROCESSING_TIME, now)[0]).column("k").to_pylist() == ["a"]
    assert TaskTime.bounded(now).until(PROCESSING_TIME) == END_OF_INPUT
    assert store.keys(pop_due(store, PROCESSING_TIME, END_OF_INPUT)[0]).column("k").to_pylist() == ["b"]


def test_a_timer_per_key_needs_one_timestamp_per_key() -> None:
    store, slots = store_with(["a", "b"])
    with pytest.raises(ValueError, match="2 keys"):
        TimerService(store, slots, TaskTime(0, 0, 0)).register_event_time_timer([1])


# -- state TTL -------------------------------------------------------------------------------
def ttl_store(update_type: str = "OnCreateAndWrite") -> tuple[KeyedStateStore, np.ndarray]:
    ttl = StateTtlConfig("10 s", update_type=update_type)
    declared = {"v": ValueState("int64", ttl=ttl), "l": ListState("string", ttl=ttl)}
    store = KeyedStateStore(with_ttl_columns(declared))
    return store, store.slots(pa.table({"k": ["a", "b"]}), np.zeros(2, dtype=np.int32))


def view(kind: type[ValueStateView], store: KeyedStateStore, name: str, slots: np.ndarray, seconds: float):  # type: ignore[no-untyped-def]
    return kind(store, name, slots, int(seconds * 1_000_000))


def test_an_expired_value_is_never_returned_and_a_write_restarts_its_time() -> None:
    store, slots = ttl_store()
    view(ValueStateView, store, "v", slots, 0).update([1, 2])
    view(ValueStateView, store, "v", slots[1:], 5).update([3])
    assert view(ValueStateView, store, "v", slots, 9.9).get().to_pylist() == [1, 3]
    assert view(ValueStateView, store, "v", slots, 10).get().to_pylist() == [None, 3]  # a: written at 0
    view(ListStateView, store, "l", slots, 0).add(["x", "y"], np.array([0, 0]))
    assert view(ListStateView, store, "l", slots, 11).get().to_pylist() == [None, None]
    view(ListStateView, store, "l", slots, 11).add(["z"], np.array([0]))  # expired: starts a new list
    assert view(ListStateView, store, "l", slots, 12).get().to_pylist() == [["z"], None]  # b got nothing


def test_on_read_and_write_a_read_restarts_the_time() -> None:
    store, slots = ttl_store("OnReadAndWrite")
    view(ValueStateView, store, "v", slots, 0).update([1, 2])
    assert view(ValueStateView, store, "v", slots[:1], 8).get().to_pylist() == [1]
    assert view(ValueStateView, store, "v", slots, 15).get().to_pylist() == [1, None]  # a read at 8


def test_expire_clears_expired_values_so_compaction_drops_the_keys() -> None:
    store, slots = ttl_store()
    view(ValueStateView, store, "v", slots, 0).update([1, 2])
    view(ValueStateView, store, "v", slots[1:], 8).update([3])
    store.take_touched()
    expire(store, 12_000_000)
    assert store.touched().tolist() == [0]  # written as cleared in the next checkpoint
    assert store.live_slots().tolist() == [1]  # a full (compacted) file keeps only b
    assert with_ttl_columns({"v": ValueState("int64")}) == {"v": ValueState("int64")}


def test_ttl_options_are_checked() -> None:
    with pytest.raises(PlanError, match="update_type='OnRead' is invalid; choose one of OnCreateAndWrite"):
        StateTtlConfig("1 h", update_type="OnRead")
    with pytest.raises(PlanError, match="StateTtlConfig ttl='soon' is not a duration"):
        StateTtlConfig("soon")


# -- windows in the worker -------------------------------------------------------------------
def test_sessions_merge_where_they_intersect_touching_ones_too() -> None:
    sessions = pa.table(
        {
            "__owner": pa.array([0, 0, 0, 1, 0], pa.int64()),
            "__starts": pa.array([10, 30, 25, 10, 60], pa.int64()),
            "__ends": pa.array([20, 40, 30, 15, 70], pa.int64()),
            "__emitted": [False, True, False, False, False],
            "__dirty": [False, False, True, True, True],
            "__n": pa.array([1, 2, 3, 4, 5], pa.int64()),
        }
    )
    merged = _merge_sessions(sessions, {"__n": "sum"}).to_pylist()
    assert merged == [
        {"__owner": 0, "__starts": 10, "__ends": 20, "__emitted": False, "__dirty": False, "__n": 1},
        {
            "__owner": 0,
            "__starts": 25,
            "__ends": 40,
            "__emitted": True,
            "__dirty": True,
            "__n": 5,
        },  # 25-30 touches 30-40
        {"__owner": 0, "__starts": 60, "__ends": 70, "__emitted": False, "__dirty": True, "__n": 5},
        {"__owner": 1, "__starts": 10, "__ends": 15, "__emitted": False, "__dirty": True, "__n": 4},
    ]


def run_keyed(function, keys: tuple[str, ...], schema: pa.Schema, state, batches: list[pa.Table], time: TaskTime):  # type: ignore[no-untyped-def]
    task = KeyedTask(
        "window 'w'", schema, keys, state, 1, 1, MemoryState(), unique_keys=function.__class__ is WindowMerge, time=time
    )
    tagged = [t.append_column(KEY_GROUP_COLUMN, pa.array(np.zeros(t.num_rows, np.int32))) for t in batches]
    out = list(KeyedRunner(function, task)(iter(b for t in tagged for b in t.to_batches())))
    return pa.Table.from_batches(out, schema=schema).to_pylist()


def test_a_session_spanning_two_batches_of_one_run_merges_and_fires_once_at_its_end() -> None:
    calls = parse_aggregations({"n": "count(*)"})
    rows = [session_rows([0, 100], [50, 150]), session_rows([40], [100])]
    schema = pa.schema([("k", pa.string()), ("window_start", pa.timestamp("us", tz="UTC")),
                        ("window_end", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])  # fmt: skip
    state = SessionMerge.state({"__n": pa.int64()})
    merge = SessionMerge(calls, 0, NO_WATERMARK, None)
    got = run_keyed(merge, ("k",), schema, state, rows, TaskTime(NO_WATERMARK, 149, 0))
    assert [(r["n"], r["window_end"].timestamp() * 1e6) for r in got] == [(3, 150.0)]  # [0,50)+[40,100)+[100,150)
    got = run_keyed(
        SessionMerge(calls, 0, NO_WATERMARK, None), ("k",), schema, state, rows, TaskTime(NO_WATERMARK, 148, 0)
    )
    assert got == []  # end - 1 = 149 > watermark


def session_rows(starts: list[int], ends: list[int]) -> pa.Table:
    count = pa.array([1] * len(starts), pa.int64())
    return pa.table({"k": ["a"] * len(starts), START_MICROS: pa.array(starts, pa.int64()),
                     END_MICROS: pa.array(ends, pa.int64()), "__n": count, "__row_count": count})  # fmt: skip


def test_a_session_row_is_late_only_if_its_merged_session_is() -> None:
    """Flink merges first, then asks whether the merged window is late: a row bridging into an
    open session counts; a session of its own, past the watermark, is dropped."""
    calls = parse_aggregations({"n": "count(*)"})
    schema = pa.schema([("k", pa.string()), ("window_start", pa.timestamp("us", tz="UTC")),
                        ("window_end", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])  # fmt: skip
    state = SessionMerge.state({"__n": pa.int64()})
    open_session = session_rows([0], [380])
    late = [session_rows([20], [120]), session_rows([500], [600])]  # [20,120) merges; alone it would be late
    got = run_keyed(
        SessionMerge(calls, 0, 150, None), ("k",), schema, state, [open_session, *late], TaskTime(150, 1000, 0)
    )
    assert sorted((r["n"], int(r["window_end"].timestamp() * 1e6)) for r in got) == [(1, 600), (2, 380)]
    dropped = run_keyed(SessionMerge(calls, 0, 150, None), ("k",), schema, state, [late[0]], TaskTime(150, 1000, 0))
    assert dropped == []  # alone, [20, 120) ends before the watermark 150: late


def test_windows_fire_when_the_watermark_reaches_their_end_minus_one() -> None:
    calls = parse_aggregations({"n": "count(*)"})
    ts = pa.timestamp("us", tz="UTC")
    rows = pa.table({"k": ["a", "b"], "window_start": pa.array([0, 0], ts), "window_end": pa.array([60, 120], ts),
                     "__n": pa.array([2, 3], pa.int64())})  # fmt: skip
    schema = pa.schema([("k", pa.string()), ("window_start", ts), ("window_end", ts), ("n", pa.int64())])
    state = WindowMerge.state({"__n": pa.int64()})
    keys = ("k", "window_start", "window_end")
    got = run_keyed(WindowMerge(calls, 0, False), keys, schema, state, [rows], TaskTime(NO_WATERMARK, 59, 0))
    assert [(r["k"], r["n"]) for r in got] == [("a", 2)]


# -- plan errors before Spark ----------------------------------------------------------------
def timed_log(tmp_path: Path) -> str:
    schema = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us")), ("n", pa.int64())])
    Log.create(tmp_path / "log", 2, schema)
    return str(tmp_path / "log")


def test_a_watermark_on_a_missing_or_non_timestamp_column_is_a_plan_error(tmp_path: Path) -> None:
    path = timed_log(tmp_path)
    with pytest.raises(PlanError, match=r"event-time column 'tss' is not among its columns \['user', 'ts', 'n'\]"):
        Pipeline().source(log(path), watermark=WatermarkStrategy.for_monotonous_timestamps("tss"))
    with pytest.raises(PlanError, match="event-time column 'n' is numeric, not a timestamp"):
        Pipeline().source(log(path), watermark=WatermarkStrategy.for_monotonous_timestamps("n"))
    with pytest.raises(PlanError, match="watermark='ts' is not a watermark strategy"):
        Pipeline().source(log(path), watermark="ts")
    declared = files(str(tmp_path / "in"), schema="user string, ts timestamp_ntz", watch=True)
    with pytest.raises(PlanError, match=r"'ts' is a timestamp without time zone \(timestamp_ntz\).*tz='UTC'"):
        Pipeline().source(declared, watermark=WatermarkStrategy.for_monotonous_timestamps("ts"))


def test_window_and_timer_mistakes_are_plan_errors(tmp_path: Path) -> None:
    path = timed_log(tmp_path)
    pipeline = Pipeline()
    plain = pipeline.source(log(path)).key_by("user")
    with pytest.raises(PlanError, match=r"window\(\.\.\.\) needs event time: declare the source's"):
        plain.window(tumbling("1 min")).aggregate(n="count(*)")
    keyed = pipeline.source(log(path), watermark=STRATEGY.with_idleness("1 min")).key_by("user")
    with pytest.raises(PlanError, match="has the name of a key or of window_start"):
        keyed.window(tumbling("1 min")).aggregate(window_end="count(*)")
    with pytest.raises(PlanError, match="late_rows='late' is not a sink"):
        keyed.window(session("1 min"), late_rows="late").aggregate(n="count(*)")
    with pytest.raises(PlanError, match="is not a window"):
        keyed.window("1 min").aggregate(n="count(*)")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="on_timer=1 is not a function"):
        keyed.process(lambda b, s: b.data, "user string", on_timer=1)
    keyed.window(tumbling("1 min")).aggregate(users="count(DISTINCT user)").sink(parquet(tmp_path / "o"))
    with pytest.raises(PlanError, match=r"DISTINCT user\)' cannot be kept as running state"):
        pipeline.compile()


def test_state_and_window_mistakes_found_through_the_plan_are_plan_errors(tmp_path: Path) -> None:
    path = timed_log(tmp_path)
    pipeline = Pipeline()
    keyed = pipeline.source(log(path), watermark=STRATEGY).select("user", "n").key_by("user")
    with pytest.raises(PlanError, match=r"event-time column 'ts' .* is not among the columns reaching the window"):
        keyed.window(tumbling("1 min"))
    source = pipeline.source(log(path), watermark=STRATEGY)
    with pytest.raises(PlanError, match=r"state 'n' ttl='1 h' is not a StateTtlConfig; pass e.g\. ttl=StateTtlConfig"):
        source.key_by("user").process(lambda b, s: b.data, "user string", state={"n": ValueState("int64", ttl="1 h")})  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"process\(\.\.\.\) over session windows is not supported yet"):
        source.key_by("user").window(session("1 min")).process(lambda w: w.keys, "user string")
    with pytest.raises(PlanError, match=r"window\(\.\.\.\) after reinterpret_as_keyed is not supported yet"):
        source.reinterpret_as_keyed("user").window(tumbling("1 min"))


def test_keyflow_plan_reports_event_time_mistakes_before_spark(tmp_path: Path) -> None:
    path = timed_log(tmp_path)
    job = tmp_path / "job.py"
    job.write_text(
        "from keyflow import Pipeline, log, parquet, tumbling\n"
        "pipeline = Pipeline()\n"
        f"pipeline.source(log({path!r})).key_by('user').window(tumbling('1 min')).aggregate(n='count(*)')"
        ".sink(parquet('out'))\n"
    )
    result = CliRunner().invoke(app, ["plan", str(job)])
    assert result.exit_code == 2
    assert "window(...) needs event time: declare the source's with" in result.output


@pytest.mark.parametrize(
    ("text", "micros"),
    [("250 ms", 250_000), ("2.3 ms", 2_300), ("10 us", 10), ("1.001 s", 1_001_000), ("2 mins", 120_000_000),
     ("1 h", 3_600_000_000), ("1d", 86_400_000_000), (timedelta(milliseconds=5), 5_000), (0, 0)],
)  # fmt: skip
def test_durations_in_flink_units(text: object, micros: int) -> None:
    assert duration(text, "d") == micros


def test_window_offsets_may_be_negative_as_in_flink() -> None:
    assert tumbling("1 d", offset="-8 h").offset == -8 * 3_600_000_000
    assert sliding("10 min", "3 min").slide == 180_000_000  # a size need not be a multiple of the slide


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tumbling("1 min", offset="-2 min"), "offset '-2 min' must be shorter than the window's size"),
        (lambda: sliding("1 min", "2 min"), "slide '2 min' is longer than its size"),
        (lambda: tumbling("0 s"), "tumbling window size='0 s' must be positive"),
        (lambda: tumbling("1 fortnight"), "is not a duration"),
        (lambda: sliding("10 min", "1 min", offset="2 min"), "offset '2 min' must be shorter than the window's slide"),
        (lambda: tumbling("250 mss"), "is not a duration"),
        (lambda: WatermarkStrategy.for_bounded_out_of_orderness("ts", "-1 s"), "=.-1 s. must be zero or"),
    ],
)
def test_durations_and_window_sizes_are_checked(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match=message):
        build()
