"""Event time as the plan declares it: watermark strategies and window assigners. Pure.

Times are microseconds since the epoch (Spark's and Arrow's ``timestamp[us]``), durations
microseconds. A watermark ``W`` says, as in Flink, that no row with an event time ``<= W`` is
expected any more: a bounded out-of-orderness strategy emits ``max event time - bound - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from keyflow.errors import PlanError
from keyflow.plan.descriptors import ListState, StateDescriptor, ValueState
from keyflow.plan.durations import duration

NO_WATERMARK = -(2**63)  # before any row: nothing is late, no window is complete
END_OF_INPUT = 2**63 - 1  # a bounded input's end (Flink's Watermark.MAX_WATERMARK): every timer fires


@dataclass(frozen=True)
class WatermarkStrategy:
    """Flink's ``WatermarkStrategy``: where event time is (``column``, a timestamp column of the
    source), how far rows may be out of order, and after how long without rows a split stops
    holding the watermark back (``idleness``; None: never)."""

    column: str
    out_of_orderness: int = 0
    idleness: int | None = None

    @staticmethod
    def for_bounded_out_of_orderness(column: str, max_out_of_orderness: Any) -> WatermarkStrategy:
        """Rows may arrive up to ``max_out_of_orderness`` behind the latest event time seen."""
        return WatermarkStrategy(_column(column), duration(max_out_of_orderness, "max_out_of_orderness"))

    @staticmethod
    def for_monotonous_timestamps(column: str) -> WatermarkStrategy:
        """Event time never decreases within a split."""
        return WatermarkStrategy(_column(column))

    def with_idleness(self, timeout: Any) -> WatermarkStrategy:
        """A split without rows for ``timeout`` (processing time) no longer holds the watermark."""
        return replace(self, idleness=duration(timeout, "idleness", zero=False))

    def describe(self) -> dict[str, Any]:
        return {"column": self.column, "out_of_orderness_us": self.out_of_orderness, "idleness_us": self.idleness}


def _column(column: Any) -> str:
    if not isinstance(column, str) or not column.strip():
        raise PlanError(f"a watermark strategy needs the event-time column's name, got {column!r}")
    return column


@dataclass(frozen=True)
class WindowAssigner:
    """Which windows a row belongs to. ``size`` and ``slide`` (sliding; a cumulating window's
    step) or ``gap`` (session)."""

    kind: str  # tumbling | sliding | cumulate | session
    size: int = 0
    slide: int = 0
    offset: int = 0

    @property
    def merging(self) -> bool:
        """Session windows merge when rows bring them within ``gap`` of each other."""
        return self.kind == "session"

    @property
    def gap(self) -> int:
        return self.size

    @property
    def period(self) -> int:
        """How often a new first window starts: the slide, or a cumulating window's size."""
        return self.size if self.kind == "cumulate" else self.slide

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"kind": self.kind}
        if self.merging:
            described["gap_us"] = self.gap
        else:
            described.update(size_us=self.size, slide_us=self.slide, offset_us=self.offset)
        return described


def tumbling(size: Any, offset: Any = 0) -> WindowAssigner:
    """Flink's ``TumblingEventTimeWindows.of(size, offset)``: back-to-back windows of ``size``."""
    length = duration(size, "tumbling window size", zero=False)
    return WindowAssigner("tumbling", length, length, _offset(offset, length, "size"))


def sliding(size: Any, slide: Any, offset: Any = 0) -> WindowAssigner:
    """Flink's ``SlidingEventTimeWindows.of(size, slide, offset)``: windows of ``size`` every ``slide``."""
    length = duration(size, "sliding window size", zero=False)
    step = duration(slide, "sliding window slide", zero=False)
    if step > length:
        raise PlanError(f"sliding window slide {slide!r} is longer than its size {size!r}; rows would be skipped")
    return WindowAssigner("sliding", length, step, _offset(offset, step, "slide"))


def cumulative(size: Any, step: Any, offset: Any = 0) -> WindowAssigner:
    """Flink's cumulating windows (``CUMULATE``, ``CumulativeWindowAssigner``): windows of
    ``size`` back to back, each also emitted every ``step`` as it grows, ``[start, start +
    step)``, ``[start, start + 2·step)``, … up to ``[start, start + size)``; a row is in each
    window of its period that ends after it. The size must be a whole number of steps."""
    length = duration(size, "cumulating window size", zero=False)
    every = duration(step, "cumulating window step", zero=False)
    if length % every:
        raise PlanError(f"cumulating window size {size!r} must be a whole number of steps {step!r} (as in Flink)")
    return WindowAssigner("cumulate", length, every, _offset(offset, length, "size"))


def session(gap: Any) -> WindowAssigner:
    """Flink's ``EventTimeSessionWindows.withGap(gap)``: a key's rows closer than ``gap`` share
    a window ``[first row, last row + gap)``; windows merge when a row bridges them."""
    return WindowAssigner("session", duration(gap, "session gap", zero=False))


def _offset(offset: Any, period: int, what: str) -> int:
    """Flink's window offset (``|offset| < slide``; e.g. ``'-8 h'`` for days in UTC+8)."""
    negative = isinstance(offset, str) and offset.strip().startswith("-")
    micros = duration(offset.strip()[1:] if negative else offset, "window offset")
    if micros >= period:
        raise PlanError(f"window offset {offset!r} must be shorter than the window's {what}")
    return -micros if negative else micros


EVENT_TIME, PROCESSING_TIME = "event_time", "processing_time"
DOMAINS = (EVENT_TIME, PROCESSING_TIME)


def timers_column(domain: str) -> str:
    return f"__{domain}_timers"


def next_timer_column(domain: str) -> str:
    return f"__next_{domain}_timer"


def timer_state() -> dict[str, StateDescriptor]:
    """The hidden state columns that hold a keyed operator's timers."""
    state: dict[str, StateDescriptor] = {}
    for domain in DOMAINS:
        state[timers_column(domain)] = ListState(pa.int64())
        state[next_timer_column(domain)] = ValueState(pa.int64())
    return state


def iso_micros(micros: int | None) -> str | None:
    """A time in microseconds since the epoch as ISO 8601 (UTC); None before any row."""
    if micros is None or micros == NO_WATERMARK:
        return None
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)).isoformat()
