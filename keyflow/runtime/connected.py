"""Two keyed streams in one operator: both inputs' rows in one exchange, a function per input.

Spark sees one DataFrame: each row carries the key columns (named as the first input's keys),
an input tag, and its own input's columns packed in a struct (the other input's struct is
null). The keyed exchange routes it by key group like any keyed operator's input, so the
state of a key sees the rows of both inputs. In the worker a call's rows are split by the
tag; each input's rows, unpacked, go to that input's function with the state of their keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyflow.errors import PlanError
from keyflow.plan.nodes import ConnectedNode, LookupJoinNode
from keyflow.runtime.keyed_function import KeyedFunction
from keyflow.runtime.operators import packed_rows
from keyflow.runtime.workers import TimedUserProcess, conform, fire_timers, not_a_table
from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime

INPUT, PACKED = "__input", ("__first", "__second")


def connected_inputs(node: ConnectedNode, first: DataFrame, second: DataFrame, names: tuple[str, str]) -> DataFrame:
    """Both inputs' rows as one frame (``names``: the inputs' operator names, for errors)."""
    check_join_keys(node, first, second, names)
    packed = packed_rows((first, second))
    tagged = []
    for position, frame in enumerate((first, second)):
        keys = [
            F.col(f"`{column}`").alias(key) for key, column in zip(node.keys, node.input_keys(position), strict=True)
        ]
        columns = [packed[i][0 if i == position else 1].alias(PACKED[i]) for i in range(2)]
        tagged.append(frame.select(*keys, F.lit(position).cast("byte").alias(INPUT), *columns))
    return tagged[0].unionByName(tagged[1])


def check_join_keys(
    node: ConnectedNode | LookupJoinNode, first: DataFrame, second: DataFrame, names: tuple[str, str]
) -> None:
    """Each input has its key columns, pairwise of one type, or a PlanError naming them."""
    for position, frame in enumerate((first, second)):
        missing = [key for key in node.input_keys(position) if key not in frame.columns]
        if missing:
            raise PlanError(
                f"operator {node.name!r}: the {('first', 'second')[position]} stream ({names[position]!r}) has no key "
                f"column(s) {missing}; its columns: {frame.columns}"
            )
    for key, other in zip(node.keys, node.other_keys, strict=True):
        one, two = first.schema[key].dataType, second.schema[other].dataType
        if one != two:
            raise PlanError(
                f"operator {node.name!r}: key {key!r} of {names[0]!r} is {one.simpleString()} but key {other!r} of "
                f"{names[1]!r} is {two.simpleString()}; equal keys of two types never meet in one key group: cast "
                "one of them with select(...) first"
            )


class CoProcess(KeyedFunction):
    """``first(batch, state)`` over a call's rows of the first input, then ``second(batch,
    state)`` over those of the second, each with the state of its keys."""

    def __init__(
        self, functions: tuple[Callable[..., Any], Callable[..., Any]], operator: str, schema: pa.Schema
    ) -> None:
        self.functions, self.operator, self.schema = functions, operator, schema

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        tags = batch.data.column(INPUT).to_numpy()
        results = []
        for position, function in enumerate(self.functions):
            rows = np.flatnonzero(tags == position)
            if not len(rows):
                continue
            packed = batch.data.column(PACKED[position]).take(pa.array(rows)).combine_chunks()
            one, keys = batch.of_rows(rows, pa.Table.from_struct_array(packed))
            result = function(one, state.of_keys(keys))
            if result is None:
                raise not_a_table(f"{self.operator}'s {('first', 'second')[position]} function", result)
            results.append(conform(result, self.schema, self.operator))
        return pa.concat_tables(results) if results else None


class TimedCoProcess(CoProcess):
    """A :class:`CoProcess` with ``on_timer``: the keys' timers fire as a one-input process
    function's do, whichever input registered them."""

    timed = True

    def __init__(
        self,
        functions: tuple[Callable[..., Any], Callable[..., Any]],
        operator: str,
        schema: pa.Schema,
        on_timer: Callable[..., Any],
    ) -> None:
        super().__init__(functions, operator, schema)
        self.on_timer = on_timer

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        return fire_timers(self.on_timer, self.operator, time, store, TimedUserProcess.MAX_ROUNDS)
