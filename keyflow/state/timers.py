"""Timers as keyed state: each key's pending event-time and processing-time timers.

As Flink's key-group-partitioned timer queues, timers live with the key's other state (two
hidden columns per time domain: the key's sorted timestamps and the earliest of them), so
they are written, restored and rescaled by key group with it, and a timer removed when it
fires is removed in the same checkpoint version as the rows it emitted: each (key,
timestamp) fires once across failures. Everything is vectorised: a micro-batch's due keys
are one NumPy comparison over the earliest-timer column; registering and deleting merge
sorted arrays. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.plan.event_time import (
    END_OF_INPUT,
    EVENT_TIME,
    NO_WATERMARK,
    PROCESSING_TIME,
    next_timer_column,
    timers_column,
)
from keyflow.state.key_index import Slots
from keyflow.state.memory import KeyedStateStore

TIMESTAMP = pa.timestamp("us", tz="UTC")


def window_fires_at(ends: pa.Array | pa.ChunkedArray) -> pa.Array:
    """When windows ending at ``ends`` (timestamps) fire: their last microsecond, Flink's
    ``TimeWindow.maxTimestamp()``, as event time in microseconds."""
    return pc.subtract(ends.cast(TIMESTAMP).cast(pa.int64()), 1)


LATEST_DATETIME = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999 in microseconds


@dataclass(frozen=True)
class TaskTime:
    """The times a keyed subtask runs a micro-batch at (microseconds since the epoch):
    ``watermark_before`` held while the batch's rows arrived (rows at or before it are late),
    ``watermark`` is reached once they are processed (timers and windows up to it fire),
    ``processing_time`` is the driver's clock when the micro-batch started (state TTL runs on
    it); ``end_of_input``: a bounded input's end, where every timer fires; ``idle``: every
    split of the source is idle (an operator with other inputs goes on without it)."""

    watermark_before: int
    watermark: int
    processing_time: int
    end_of_input: bool = False
    idle: bool = False

    @staticmethod
    def bounded(processing_time: int) -> TaskTime:
        """A batch run: nothing is late; at the end of the input every timer fires (event time
        and, as in Flink's batch execution, processing time)."""
        return TaskTime(NO_WATERMARK, END_OF_INPUT, processing_time, end_of_input=True)

    @staticmethod
    def earliest(times: Iterable[TaskTime]) -> TaskTime:
        """An operator reading several inputs runs at the smallest of their times (Flink's
        watermark of a two-input operator is the minimum of its inputs'), leaving out idle
        inputs unless all are idle (as Flink's ``StatusWatermarkValve``)."""
        given = list(times)
        found = [t for t in given if not t.idle] or given
        return TaskTime(
            min(t.watermark_before for t in found),
            min(t.watermark for t in found),
            min(t.processing_time for t in found),
            all(t.end_of_input for t in found),
            all(t.idle for t in found),
        )

    def until(self, domain: str) -> int:
        """Timers of ``domain`` at or before this time fire."""
        if domain == EVENT_TIME:
            return self.watermark
        return END_OF_INPUT if self.end_of_input else self.processing_time


def micros(values: Any) -> npt.NDArray[np.int64]:
    """Timestamps (Arrow, pandas, NumPy datetime64 or integer microseconds) as int64 microseconds."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.null_count:
            raise ValueError("a timer's timestamp is null; give every key a timestamp (filter the nulls first)")
        if pa.types.is_timestamp(values.type):
            values = values.cast(pa.timestamp("us", tz=values.type.tz)).view(pa.int64())
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    array = np.asarray(values)
    if np.issubdtype(array.dtype, np.datetime64):
        return array.astype("datetime64[us]").astype(np.int64)
    if array.dtype == object:
        return np.asarray(pd.to_datetime(array, utc=True).as_unit("us").asi8, dtype=np.int64)
    return array.astype(np.int64)


class TimerService:
    """What a ``process`` function with ``on_timer`` uses as ``state.timers``: register or
    delete timers for the keys of the call, vectorised. ``timestamps`` holds one timestamp per
    key of the call (aligned with ``batch.keys``), or with ``key_index`` one per entry, for key
    ``key_index[i]``; registering a (key, timestamp) twice keeps one timer (as Flink)."""

    def __init__(self, store: KeyedStateStore, slots: Slots, time: TaskTime) -> None:
        self._store, self._slots, self._time = store, slots, time

    def of_keys(self, positions: npt.NDArray[np.int64]) -> TimerService:
        """The timers of the keys at ``positions`` (of this call's keys), for a call over them."""
        return TimerService(self._store, self._slots[positions], self._time)

    @property
    def current_watermark(self) -> pa.TimestampScalar | None:
        """The watermark the rows of this call arrived under (None before the first; at the end
        of a bounded input the largest timestamp Python's datetime holds, 9999-12-31)."""
        watermark = self._time.watermark_before
        return None if watermark == NO_WATERMARK else pa.scalar(min(watermark, LATEST_DATETIME), TIMESTAMP)

    @property
    def current_processing_time(self) -> pa.TimestampScalar:
        return pa.scalar(self._time.processing_time, TIMESTAMP)

    def register_event_time_timer(self, timestamps: Any, key_index: Any = None) -> None:
        self._change(EVENT_TIME, timestamps, key_index, delete=False)

    def delete_event_time_timer(self, timestamps: Any, key_index: Any = None) -> None:
        self._change(EVENT_TIME, timestamps, key_index, delete=True)

    def register_processing_time_timer(self, timestamps: Any, key_index: Any = None) -> None:
        self._change(PROCESSING_TIME, timestamps, key_index, delete=False)

    def delete_processing_time_timer(self, timestamps: Any, key_index: Any = None) -> None:
        self._change(PROCESSING_TIME, timestamps, key_index, delete=True)

    def _change(self, domain: str, timestamps: Any, key_index: Any, delete: bool) -> None:
        times = micros(timestamps)
        positions = np.arange(len(self._slots)) if key_index is None else np.asarray(key_index, dtype=np.int64)
        if len(positions) != len(times):
            raise ValueError(
                f"{len(times)} timer timestamps for {len(positions)} keys; give one per key of the call "
                "(batch.keys), or pass key_index= with one key position per timestamp"
            )
        if len(positions) and (positions.min() < 0 or positions.max() >= len(self._slots)):
            raise ValueError(f"timer key_index holds positions outside 0..{len(self._slots) - 1}")
        change_timers(self._store, self._slots, domain, positions, times, delete)


def change_timers(
    store: KeyedStateStore,
    slots: Slots,
    domain: str,
    positions: npt.NDArray[np.int64],
    times: npt.NDArray[np.int64],
    delete: bool,
) -> None:
    """Add (or remove) timer ``times[i]`` for the key at ``slots[positions[i]]``."""
    touched = np.unique(positions)
    if not len(touched):
        return
    target = slots[touched]
    lists = store.columns[timers_column(domain)].get(target)
    flat = np.asarray(lists.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    owners = np.asarray(lists.value_parent_indices().to_numpy(zero_copy_only=False), dtype=np.int64)
    local = np.searchsorted(touched, positions)  # each change's position among ``touched``
    if delete:
        gone = pd.MultiIndex.from_arrays([owners, flat]).isin(pd.MultiIndex.from_arrays([local, times]))
        owners, flat = owners[~gone], flat[~gone]
    else:
        owners, flat = np.concatenate([owners, local]), np.concatenate([flat, times])
    _store_timers(store, target, domain, owners, flat)


def _store_timers(
    store: KeyedStateStore, target: Slots, domain: str, owners: npt.NDArray[np.int64], times: npt.NDArray[np.int64]
) -> None:
    """Each key's timers as a sorted, duplicate-free list, and its earliest (null: none)."""
    order = np.lexsort((times, owners))
    owners, times = owners[order], times[order]
    keep = np.ones(len(times), dtype=bool)
    keep[1:] = (owners[1:] != owners[:-1]) | (times[1:] != times[:-1])
    owners, times = owners[keep], times[keep]
    counts = np.bincount(owners, minlength=len(target))
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    empty = counts == 0
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(times, pa.int64()), mask=pa.array(empty))
    store.columns[timers_column(domain)].set(target, lists)
    earliest = np.zeros(len(target), dtype=np.int64)
    earliest[~empty] = times[offsets[:-1][~empty]]
    store.columns[next_timer_column(domain)].set(target, pa.array(earliest, pa.int64(), mask=empty))


def pop_due(store: KeyedStateStore, domain: str, until: int) -> tuple[Slots, npt.NDArray[np.int64]]:
    """The keys with a timer at or before ``until``, each with its earliest one (removed), in
    timestamp order: one round of firing. A round stops before any key's second timer, so the
    rounds together fire every timer in timestamp order (as Flink's timer queue)."""
    due = store.columns[next_timer_column(domain)].at_most(until, len(store))
    if not len(due):
        return due, np.zeros(0, dtype=np.int64)
    earliest = np.asarray(store.columns[next_timer_column(domain)].get(due).to_numpy(zero_copy_only=False))
    lists = store.columns[timers_column(domain)].get(due)
    lengths = np.asarray(lists.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
    if (lengths > 1).any():
        firsts = np.asarray(lists.offsets.to_numpy()[:-1], dtype=np.int64)
        seconds = np.asarray(lists.values.to_numpy(), dtype=np.int64)[firsts[lengths > 1] + 1]
        within = earliest <= min(until, int(seconds.min()))
        due, earliest = due[within], earliest[within]
    order = np.argsort(earliest, kind="stable")
    due, earliest = due[order], earliest[order].astype(np.int64)
    change_timers(store, due, domain, np.arange(len(due), dtype=np.int64), earliest, delete=True)
    store.touch(due)  # the removal is written with the rows the timers emit: each fires once
    return due, earliest


@dataclass(frozen=True)
class FiredTimers:
    """What ``on_timer`` receives: keys whose timers fire (each once per call), the firing
    timestamps aligned with them in ascending order, and the time domain (``event_time`` or
    ``processing_time``)."""

    keys: pa.Table
    timestamps: pa.TimestampArray
    time_domain: str

    @property
    def num_keys(self) -> int:
        return int(self.keys.num_rows)
