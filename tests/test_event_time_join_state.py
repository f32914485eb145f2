"""The event-time joins' state at the exact watermarks where rows leave it, driven through a
subtask's state store without Spark: a row stays while the watermark is before the last
time a row of the other input could match it, leaves when the watermark reaches it, and a
preserved row that never matched is emitted padded exactly once, then."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keyflow.plan.descriptors import StateDescriptor
from keyflow.runtime.connected import INPUT, PACKED
from keyflow.runtime.joins import (
    TIME_FIELD,
    IdleJoinRows,
    Interval,
    IntervalJoinRows,
    JoinRows,
    JoinSides,
    WindowJoinRows,
    expiry_state,
    window_state,
)
from keyflow.runtime.workers import view_kind
from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime

S = 1_000_000  # a second in microseconds
TIMESTAMP = pa.timestamp("us", tz="UTC")
LEFT = pa.struct([("user", pa.string()), ("order", pa.int64()), (TIME_FIELD, pa.int64())])
RIGHT = pa.struct([("uid", pa.string()), ("visit", pa.int64()), (TIME_FIELD, pa.int64())])
SIDES = JoinSides((True, True), (LEFT, RIGHT), (("order",), ("visit",)), changelog=False)
Pairs = list[tuple[object, object, object]]
OUTPUT = pa.schema([("user", pa.string()), ("order", pa.int64()), ("visit", pa.int64())])


class Subtask:
    """One keyed subtask's store and a join function, fed one input's rows per call."""

    def __init__(
        self, function: JoinRows, state: dict[str, StateDescriptor], keys: tuple[str, ...] = ("user",)
    ) -> None:
        self.function, self.keys = function, keys
        self.store = KeyedStateStore(state)
        self.kinds = {name: view_kind(descriptor) for name, descriptor in state.items()}

    def arrive(
        self, side: int, users: list[str], numbers: list[int], times: list[int | None], now: int = 0, **keys: pa.Array
    ) -> Pairs:
        struct = (LEFT, RIGHT)[side]
        rows = pa.StructArray.from_arrays(
            [pa.array(users), pa.array(numbers, pa.int64()), pa.array(times, pa.int64())], fields=list(struct)
        )
        columns = {"user": pa.array(users), **keys, INPUT: pa.array([side] * len(users), pa.int8())}
        columns[PACKED[side]] = rows
        columns[PACKED[1 - side]] = pa.nulls(len(users), (LEFT, RIGHT)[1 - side])
        batch = KeyedBatch.from_rows(pa.table(columns), self.keys, np.zeros(len(users), np.int32), 0)
        slots = self.store.slots(batch.keys, batch.key_groups)
        out = self.function.process(batch, KeyedState(self.store, slots, self.kinds, now=now))
        return [] if out is None else _pairs(out)

    def advance(self, watermark: int, now: int = 0) -> Pairs:
        tables = list(self.function.advance(TaskTime(watermark, watermark, now), self.store))
        return [pair for table in tables for pair in _pairs(table)]


def _pairs(table: pa.Table) -> Pairs:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("user", "order", "visit")), strict=True), key=str)


def test_interval_join_rows_leave_exactly_when_the_watermark_reaches_their_last_match() -> None:
    interval = Interval(lower=0, upper=10 * S)  # a visit from 0 to 10 s after the order
    task = Subtask(IntervalJoinRows(SIDES, OUTPUT, interval), {**SIDES.state(), **expiry_state()})
    assert task.arrive(0, ["a", "b"], [1, 2], [100 * S, 200 * S]) == []
    assert task.advance(110 * S - 1) == []  # order 1 may still meet a visit at 110 s
    assert task.arrive(1, ["a"], [7], [110 * S]) == [("a", 1, 7)]  # the upper bound is included
    assert task.advance(110 * S) == []  # order 1 and visit 7 leave; both matched: nothing padded
    assert task.arrive(0, ["a"], [3], [105 * S]) == []  # late: visit 7 has left; stored until 115 s
    assert task.arrive(1, ["a"], [8], [112 * S]) == [("a", 3, 8)]  # a late row meets what comes while it waits
    assert task.advance(115 * S - 1) == []
    assert task.advance(115 * S) == []  # order 3 matched visit 8: it leaves without a padded row
    assert task.advance(210 * S - 1) == []
    assert task.advance(210 * S) == [("b", 2, None)]  # order 2 never matched: padded, once
    assert task.advance(300 * S) == []
    assert not len(task.store.live_slots())  # every key left with nothing: compaction drops them


def test_rows_without_event_time_match_nothing_and_leave_padded_at_the_first_watermark() -> None:
    task = Subtask(IntervalJoinRows(SIDES, OUTPUT, Interval(-5 * S, 5 * S)), {**SIDES.state(), **expiry_state()})
    assert task.arrive(0, ["c"], [4], [None]) == []
    assert task.arrive(1, ["c", "c"], [8, 9], [300 * S, None]) == []  # a null time equals no other time
    assert task.advance(0) == [("c", 4, None), ("c", None, 9)]
    assert task.advance(305 * S) == [("c", None, 8)]


def test_window_join_rows_leave_when_the_watermark_reaches_the_window_end() -> None:
    keys = ("user", "window_start", "window_end")
    task = Subtask(WindowJoinRows(SIDES, OUTPUT), {**SIDES.state(), **window_state()}, keys)

    def window(users: int) -> dict[str, pa.Array]:
        return {"window_start": pa.array([0] * users, TIMESTAMP), "window_end": pa.array([60 * S] * users, TIMESTAMP)}

    assert task.arrive(0, ["a", "b"], [1, 2], [10 * S, 20 * S], **window(2)) == []
    assert task.arrive(1, ["a"], [7], [59 * S], **window(1)) == [("a", 1, 7)]
    assert task.advance(60 * S - 2) == []  # the window's last microsecond is not yet passed
    assert task.advance(60 * S - 1) == [("b", 2, None)]  # it ends: order 2 never matched
    assert task.advance(120 * S) == []
    assert not len(task.store.live_slots())


def test_a_regular_join_forgets_a_key_idle_for_the_state_ttl() -> None:
    """``table.exec.state.ttl``: a key's rows of both inputs go together once it has not been
    written for the TTL (processing time), never read after that even before they are
    cleared; a key written meanwhile keeps all of its rows."""
    inner = JoinSides((False, False), (LEFT, RIGHT), (("order",), ("visit",)), changelog=False)
    task = Subtask(IdleJoinRows(inner, OUTPUT, ttl=10 * S), JoinRows.state_of(inner))
    assert task.arrive(0, ["a", "b"], [1, 2], [0, 0], now=0) == []
    assert task.arrive(1, ["b"], [8], [0], now=5 * S) == [("b", 2, 8)]  # b written again at 5 s
    assert task.arrive(1, ["a", "b"], [7, 9], [0, 0], now=10 * S) == [("b", 2, 9)]  # a idle for 10 s: no order 1
    assert task.arrive(0, ["c"], [3], [0], now=11 * S) == []
    assert task.advance(0, now=21 * S - 1) == []
    assert len(task.store.live_slots()) == 1  # c, written at 11 s
    assert task.advance(0, now=21 * S) == []
    assert not len(task.store.live_slots())


def test_an_outer_join_under_the_state_ttl_never_retracts_a_row_of_a_forgotten_key() -> None:
    """A padded row of a key that went idle stays (as in Flink): its match, arriving later,
    is padded itself, and no -D is emitted for a row the state no longer knows."""
    full = JoinSides((True, True), (LEFT, RIGHT), (("order",), ("visit",)), changelog=True)
    output = pa.schema([*OUTPUT, pa.field("op", pa.string())])
    task = Subtask(IdleJoinRows(full, output, ttl=10 * S), JoinRows.state_of(full))
    assert task.arrive(0, ["a"], [1], [0], now=0) == [("a", 1, None)]  # +I, padded
    assert task.arrive(1, ["a"], [7], [0], now=10 * S) == [("a", None, 7)]  # not -D (a, 1, None), +I (a, 1, 7)
