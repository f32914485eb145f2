"""The worker protocol every keyed kind runs by (``KeyedFunction``: open, process, finish,
close), driven through the real ``KeyedRunner`` over Arrow batches, without Spark."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from keyflow.errors import DataError, PipelineError, WorkerError, decode
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import ValueState
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.workers import KeyedRunner, KeyedTask, UserProcess
from keyflow.state.durable import MemoryState
from keyflow.state.keyed import KeyedBatch, KeyedState

OUTPUT = pa.schema([("k", pa.string()), ("n", pa.int64())])
STATE = {"n": ValueState("int64")}


class Recorder(KeyedFunction):
    """Counts rows per key in state; records every protocol call; emits the counts at finish."""

    finishes = True

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.calls: list[Any] = []
        self.fail_on_batch = fail_on_batch

    def open(self, subtask: int, key_groups: tuple[int, int]) -> None:
        self.calls.append(("open", subtask, key_groups))

    def process(self, batch: KeyedBatch, state: KeyedState) -> None:
        self.calls.append(("process", batch.data.num_rows))
        if len(self.calls) - 1 == self.fail_on_batch:
            raise ValueError("boom")
        seen = state["n"].get().fill_null(0).to_numpy()
        state["n"].update(pa.array(seen + batch.counts, pa.int64()))

    def finish(self, keys: pa.Table, state: KeyedState) -> pa.Table:
        self.calls.append(("finish", keys.num_rows))
        return keys.append_column("n", state["n"].get())

    def close(self) -> None:
        self.calls.append(("close",))


def run(function: KeyedFunction, keys: list[str], batch_rows: int) -> list[dict[str, Any]]:
    table = pa.table({"k": keys, KEY_GROUP_COLUMN: pa.array(np.zeros(len(keys), np.int32))})
    runner = KeyedRunner(function, KeyedTask("process 'p'", OUTPUT, ("k",), STATE, 1, 1, MemoryState()))
    batches = list(runner(iter(table.to_batches(max_chunksize=batch_rows))))
    return pa.Table.from_batches(batches, schema=OUTPUT).to_pylist()


def test_open_then_each_batch_then_finish_with_the_touched_keys_then_close() -> None:
    function = Recorder()
    got = run(function, ["a", "b", "a", "c", "a"], batch_rows=2)
    assert sorted((row["k"], row["n"]) for row in got) == [("a", 3), ("b", 1), ("c", 1)]
    assert function.calls == [
        ("open", 0, (0, 0)),
        ("process", 2),
        ("process", 2),
        ("process", 1),
        ("finish", 3),
        ("close",),
    ]


def test_close_follows_a_failure_and_the_error_names_the_operator() -> None:
    function = Recorder(fail_on_batch=2)
    with pytest.raises(WorkerError) as raised:
        run(function, ["a", "b", "a", "c"], batch_rows=2)
    error = decode(str(raised.value))
    assert isinstance(error, PipelineError)
    assert str(error) == "process 'p' raised ValueError: boom"
    assert function.calls[-1] == ("close",)
    assert ("finish", 3) not in function.calls


def test_a_function_without_finish_is_not_asked_for_its_keys() -> None:
    """Gathering a subtask's touched keys costs a table of every key: only a function that
    emits at finish (``finishes``) gets them."""

    class Counting(Recorder):
        finishes = False

    function = Counting()
    assert run(function, ["a", "b"], batch_rows=10) == []
    assert [call[0] for call in function.calls] == ["open", "process", "close"]


def test_a_process_function_that_returns_nothing_is_an_error_not_silence() -> None:
    """A forgotten ``return`` would drop every row of the operator; an empty table emits none."""
    with pytest.raises(WorkerError) as raised:
        run(UserProcess(lambda batch, state: None, "process 'p'"), ["a"], batch_rows=10)
    error = decode(str(raised.value))
    assert isinstance(error, DataError)
    assert "process 'p' returned NoneType; return a pyarrow.Table" in str(error)
    assert run(UserProcess(lambda batch, state: OUTPUT.empty_table(), "process 'p'"), ["a"], batch_rows=10) == []
