"""Code that runs inside Spark's Python workers, over Arrow record batches.

Both runners (``map_batches``'s and a keyed subtask's) are pickled to the workers by
``mapInArrow``. Every failure is re-raised as a ``WorkerError`` (a keyflow error naming the
operator, encoded) so the driver rebuilds it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark import Broadcast, TaskContext

from keyflow.errors import DataError, PipelineError, WorkerError
from keyflow.keygroups import KEY_GROUP_COLUMN, key_group_range
from keyflow.plan.descriptors import ListState, MapState, StateDescriptor
from keyflow.plan.event_time import DOMAINS
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.schemas import ColumnsDifferError, TypesDifferError, conform_to
from keyflow.state.durable import CheckpointedState, MemoryState
from keyflow.state.keyed import (
    KeyedBatch,
    KeyedState,
    ListStateView,
    MapStateView,
    ValueStateView,
    expire,
    key_boundaries,
)
from keyflow.state.memory import KeyedStateStore
from keyflow.state.splits import PREVIOUS_KEY_GROUP
from keyflow.state.timers import TIMESTAMP, FiredTimers, TaskTime, TimerService, pop_due


def conform(result: Any, schema: pa.Schema, operator: str) -> pa.Table:
    """The function's result as a table of exactly ``schema``, or a clear error."""
    if isinstance(result, pa.RecordBatch):
        table = pa.Table.from_batches([result])
    elif isinstance(result, pa.Table):
        table = result
    elif type(result).__name__ == "DataFrame" and hasattr(result, "columns"):
        try:
            table = pa.Table.from_pandas(result, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise WorkerError(
                DataError(
                    f"{operator} returned a pandas DataFrame Arrow cannot convert ({error}); give each column one type"
                )
            ) from None
    else:
        raise not_a_table(operator, result)
    try:
        return conform_to(table, schema)
    except ColumnsDifferError:
        raise WorkerError(
            DataError(
                f"{operator} returned columns {table.column_names} but its schema declares "
                f"{schema.names}; return exactly the declared columns or change the schema"
            )
        ) from None
    except TypesDifferError as error:
        returned = ", ".join(f"{f.name} {f.type}" for f in table.schema)
        raise WorkerError(
            DataError(
                f"{operator} returned ({returned}) which does not fit its schema "
                f"({', '.join(f'{f.name} {f.type}' for f in schema)}): {error}"
            )
        ) from None


def not_a_table(operator: str, result: Any) -> WorkerError:
    return WorkerError(
        DataError(
            f"{operator} returned {type(result).__name__}; return a pyarrow.Table, pyarrow.RecordBatch or "
            "pandas.DataFrame (an empty one to emit nothing)"
        )
    )


class BatchMapper:
    """``map_batches``: one user call per Arrow batch."""

    def __init__(self, function: Callable[[Any], Any], schema: pa.Schema, batch_format: str, operator: str) -> None:
        self.function, self.schema, self.batch_format, self.operator = function, schema, batch_format, operator

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            argument = batch.to_pandas() if self.batch_format == "pandas" else batch
            result = _call(self.function, self.operator, argument)
            yield from conform(result, self.schema, self.operator).to_batches()


class UserProcess(KeyedFunction):
    """A ``process(fn)`` function: ``fn(batch, state)``, or ``fn(batch, state, side)`` with a
    broadcast side input (shipped once per executor, passed whole to every call). It must
    return rows: a None (a forgotten ``return``) is an error, not silently no output."""

    def __init__(self, function: Callable[..., Any], operator: str, side: Broadcast[pa.Table] | None = None) -> None:
        self.function, self.operator, self.side = function, operator, side

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        result = self.function(batch, state) if self.side is None else self.function(batch, state, self.side.value)
        if result is None:
            raise not_a_table(self.operator, result)
        return result


class TimedUserProcess(UserProcess):
    """A ``process(fn, on_timer=...)`` function: rows as :class:`UserProcess`, then, as time
    advances, ``on_timer(timers, state)`` for the keys whose timers are due, in rounds of one
    timer per key in timestamp order (a timer registered at or before the time fires in a
    later round, as in Flink); event time first, then processing time."""

    timed = True
    MAX_ROUNDS = 100_000

    def __init__(self, function: Callable[..., Any], on_timer: Callable[..., Any], operator: str) -> None:
        super().__init__(function, operator)
        self.on_timer = on_timer

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        return fire_timers(self.on_timer, self.operator, time, store, self.MAX_ROUNDS)


def fire_timers(
    on_timer: Callable[..., Any], operator: str, time: TaskTime, store: KeyedStateStore, max_rounds: int
) -> Iterator[Any]:
    """``on_timer(timers, state)`` for the keys whose timers are due at ``time``, in rounds of
    one timer per key in timestamp order; event time first, then processing time."""
    kinds = {name: view_kind(descriptor) for name, descriptor in store.descriptors.items()}
    firing = dataclasses.replace(time, watermark_before=time.watermark)
    for domain in DOMAINS:
        for _ in range(max_rounds):
            slots, stamps = pop_due(store, domain, time.until(domain))
            if not len(slots):
                break
            fired = FiredTimers(store.keys(slots), pa.array(stamps, TIMESTAMP), domain)
            state = KeyedState(store, slots, kinds, TimerService(store, slots, firing), time.processing_time)
            result = on_timer(fired, state)
            if result is None:
                raise not_a_table(f"{operator}'s on_timer", result)
            yield result
        else:
            kind = domain.replace("_", " ")
            raise WorkerError(
                DataError(
                    f"{operator}: {max_rounds:,} rounds of {kind} timers in one micro-batch (a key "
                    "with that many due timers, or on_timer registering timers at or before the time they fire "
                    "at); register later timers (e.g. timestamp + interval) or fewer per key"
                )
            )


BOUNDED = TaskTime.bounded(0)  # replaced by a run's own (with its clock) by the frame builder


@dataclass(frozen=True)
class KeyedTask:
    """What a keyed subtask runs besides its function: the operator's name and output schema,
    its keys, the declared state and where it lives, and how rows reach it.

    With ``order_by``, rows arrive sorted by key (Spark sorts them) and every call receives
    whole keys sorted by ``order_by`` (Arrow sorts each batch; the rows of the batch's last
    key wait for the next batch), so a key's rows are seen in order. Without it, rows arrive
    in any order and each batch is grouped by hashing its keys (no sort anywhere); a key's
    rows may span calls, in arrival order, and state carries them. ``report_keys``: a
    pre-keyed source's operator reports the keys new to its state and those seen under
    another key group, for the driver's one-split-per-key check. ``ranges``: each subtask's
    key groups where a batch job decided them from the bytes (auto-parallelism), instead of
    the even ranges of ``parallelism``. ``unique_keys``: each row has a key of its own (a
    streaming aggregate's merge receives Spark's one row per key): no grouping needed."""

    operator: str
    schema: pa.Schema
    keys: tuple[str, ...]
    state: dict[str, StateDescriptor]
    max_parallelism: int
    parallelism: int
    keyed_state: MemoryState | CheckpointedState
    order_by: tuple[str, ...] = ()
    reinterpreted: bool = False
    verify: bool = True
    report_keys: bool = False
    ranges: tuple[tuple[int, int], ...] | None = None
    unique_keys: bool = False
    time: TaskTime = BOUNDED


class KeyedRunner:
    """One keyed subtask: its rows grouped by key, its state restored and written, its
    :class:`~keyflow.runtime.keyed_function.KeyedFunction` driven (open, process each batch,
    finish, close). Pickled to the workers by ``mapInArrow``."""

    def __init__(self, function: KeyedFunction, task: KeyedTask) -> None:
        self.function, self.task = function, task

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = self.task
        context = TaskContext.get()
        self._subtask = context.partitionId() if context else 0
        self._range = (
            task.ranges[self._subtask]
            if task.ranges
            else key_group_range(task.max_parallelism, task.parallelism, self._subtask)
        )
        tables = _whole_keys(batches, task.keys) if task.order_by else _tables(batches)
        first = next(tables, None)
        if first is None and not task.keyed_state.must_write(self._subtask) and not self.function.timed:
            return  # no rows: nothing to restore, nothing to write (a micro-batch a filter emptied)
        self._store = task.keyed_state.open(task.state, self._subtask, *self._range)
        self._kinds = {name: view_kind(descriptor) for name, descriptor in task.state.items()}
        self._reports: list[pa.Table] = []
        _call(self.function.open, task.operator, self._subtask, self._range)
        try:
            for table in itertools.chain([first] if first is not None else [], tables):
                yield from self._run(table)
            if self.function.finishes and len(touched := self._store.touched()):
                state = KeyedState(self._store, touched, self._kinds, now=task.time.processing_time)
                yield from self._emit(_call(self.function.finish, task.operator, self._store.keys(touched), state))
            if self.function.timed:
                fired = _call(lambda: list(self.function.advance(task.time, self._store)), task.operator)
                for result in fired:
                    yield from self._emit(result)
            if any(descriptor.ttl is not None for descriptor in task.state.values()):
                expire(self._store, task.time.processing_time)
            if first is None and not len(self._store.touched()) and not task.keyed_state.must_write(self._subtask):
                task.keyed_state.release(self._store, self._subtask, *self._range)  # opened for timers: unchanged
            else:
                task.keyed_state.close(self._store, self._subtask, *self._range)
            if self._reports:
                task.keyed_state.report_keys(pa.concat_tables(self._reports), *self._range)
        finally:  # also after a failure, as Flink closes its functions
            _call(self.function.close, task.operator)

    def _emit(self, result: Any) -> Iterator[pa.RecordBatch]:
        if result is not None:
            yield from conform(result, self.task.schema, self.task.operator).to_batches()

    def _report(self, keys: pa.Table, key_groups: npt.NDArray[np.int32], previous: npt.NDArray[np.int32]) -> None:
        """Keys new to this subtask's state, or known here under another key group (split)."""
        check = previous != key_groups
        if check.any():
            rows = keys.filter(pa.array(check))
            rows = rows.append_column(KEY_GROUP_COLUMN, pa.array(key_groups[check], pa.int32()))
            known = previous[check]
            self._reports.append(rows.append_column(PREVIOUS_KEY_GROUP, pa.array(known, pa.int32(), mask=known < 0)))

    def _run(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        task = self.task
        if task.order_by:
            table = table.sort_by([(column, "ascending") for column in (*task.keys, *task.order_by)])
        key_groups = table.column(KEY_GROUP_COLUMN).to_numpy().astype(np.int32)
        first, last = self._range
        if task.verify and (key_groups.min() < first or key_groups.max() > last):
            raise WorkerError(DataError(self._outside_range(table, key_groups, first, last)))
        rows = table.drop_columns([KEY_GROUP_COLUMN])
        if task.unique_keys:
            keyed = _one_row_per_key(rows, task.keys, key_groups, self._subtask)
        else:
            group = KeyedBatch.from_sorted if task.order_by else KeyedBatch.from_rows
            keyed = group(rows, task.keys, key_groups, self._subtask)
        slots, previous = self._store.slots_and_key_groups(keyed.keys, keyed.key_groups)
        if task.report_keys:
            self._report(keyed.keys, keyed.key_groups, previous)
            first_of_key = keyed.key_groups[keyed.key_index]
            mixed = keyed.row_key_groups != first_of_key  # rows of one key from two splits, in this call
            if mixed.any():
                self._report(keyed.keys.take(keyed.key_index[mixed]), keyed.row_key_groups[mixed], first_of_key[mixed])
        timers = TimerService(self._store, slots, task.time) if self.function.timed else None
        state = KeyedState(self._store, slots, self._kinds, timers, task.time.processing_time)
        yield from self._emit(_call(self.function.process, self.task.operator, keyed, state))

    def _outside_range(self, table: pa.Table, key_groups: npt.NDArray[np.int32], first: int, last: int) -> str:
        outside = np.flatnonzero((key_groups < first) | (key_groups > last))
        where = f"{self.task.operator}: subtask {self._subtask} (key groups {first}..{last}) received"
        if not self.task.reinterpreted:
            return f"{where} key groups outside its range; the keyed exchange is broken (please report this)"
        key = {name: table.column(name)[int(outside[0])].as_py() for name in self.task.keys}
        return (
            f"{where} {len(outside)} row(s) of other subtasks' key groups, e.g. key {key} in key group "
            f"{int(key_groups[outside[0]])}: the stream is not keyed by {list(self.task.keys)} as reinterpret_as_keyed "
            "declared (were the key columns changed?); use key_by(...), or set pipeline.pre-keyed.verify=off "
            "only if the keys are right"
        )


def _one_row_per_key(
    rows: pa.Table, keys: tuple[str, ...], key_groups: npt.NDArray[np.int32], subtask: int
) -> KeyedBatch:
    positions = np.arange(rows.num_rows, dtype=np.int64)
    ones = np.ones(rows.num_rows, dtype=np.int64)
    return KeyedBatch(rows, rows.select(list(keys)), positions, positions, ones, key_groups, subtask, key_groups)


def _tables(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Spark's Arrow batches as tables, one per call of the function."""
    for batch in batches:
        if batch.num_rows:
            yield pa.Table.from_batches([batch])


def _whole_keys(batches: Iterator[pa.RecordBatch], keys: tuple[str, ...]) -> Iterator[pa.Table]:
    """Rows sorted by key (Spark sorted them) cut into tables of whole keys: the rows of each
    batch's last key wait for the next batch."""
    pending: pa.Table | None = None
    for table in _tables(batches):
        if pending is not None:
            table = pa.concat_tables([pending, table])
        cut = int(np.flatnonzero(key_boundaries(table, keys))[-1])
        table, pending = table.slice(0, cut), table.slice(cut)
        if table.num_rows:
            yield table
    if pending is not None:
        yield pending


def view_kind(descriptor: StateDescriptor) -> type[ValueStateView]:
    if isinstance(descriptor, ListState):
        return ListStateView
    if isinstance(descriptor, MapState):
        return MapStateView
    return ValueStateView


def _call(function: Callable[..., Any], operator: str, *arguments: Any) -> Any:
    """A user's function, or a keyed kind's step: a failure names the operator."""
    try:
        return function(*arguments)
    except WorkerError:
        raise
    except Exception as error:
        raise WorkerError(PipelineError(f"{operator} raised {type(error).__name__}: {error}")) from error
