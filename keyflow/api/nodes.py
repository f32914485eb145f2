"""The logical operators a pipeline is built from: one small class per operator.

Nodes only describe; ``keyflow.plan`` decides parallelism and exchanges, and
``keyflow.runtime`` turns them into Spark DataFrame operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from keyflow.api.state import StateDescriptor


@dataclass(eq=False)
class Node:
    """An operator with its inputs; ``parallelism`` is the user's explicit setting, if any."""

    inputs: tuple[Node, ...]
    name: str
    parallelism: int | None = None
    uid: int = field(default=0, init=False)  # set by the pipeline: its order of creation

    kind = "node"

    def describe(self) -> dict[str, Any]:
        """What the plan shows (JSON-serialisable)."""
        return {}


@dataclass(eq=False)
class SourceNode(Node):
    source: Any = None
    kind = "source"

    def describe(self) -> dict[str, Any]:
        return dict(self.source.describe())


@dataclass(eq=False)
class SelectNode(Node):
    expressions: tuple[str, ...] = ()
    kind = "select"

    def describe(self) -> dict[str, Any]:
        return {"expressions": list(self.expressions)}


@dataclass(eq=False)
class FilterNode(Node):
    condition: str = ""
    kind = "filter"

    def describe(self) -> dict[str, Any]:
        return {"condition": self.condition}


@dataclass(eq=False)
class WithColumnsNode(Node):
    columns: dict[str, str] = field(default_factory=dict)
    kind = "with_columns"

    def describe(self) -> dict[str, Any]:
        return {"columns": dict(self.columns)}


@dataclass(eq=False)
class MapBatchesNode(Node):
    function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    batch_format: str = "arrow"
    kind = "map_batches"

    def describe(self) -> dict[str, Any]:
        return {"function": _function_name(self.function), "format": self.batch_format}


@dataclass(eq=False)
class KeyedNode(Node):
    """An operator that needs its input partitioned by key group."""

    keys: tuple[str, ...] = ()
    on_null: Any = None  # None: pipeline.null-keys; or a sink for a dead letter queue


@dataclass(eq=False)
class AggregateNode(KeyedNode):
    aggregations: dict[str, str] = field(default_factory=dict)
    kind = "aggregate"

    def describe(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "aggregations": dict(self.aggregations)}


@dataclass(eq=False)
class ProcessNode(KeyedNode):
    function: Callable[..., Any] | None = None
    schema: pa.Schema | str | None = None
    state: dict[str, StateDescriptor] = field(default_factory=dict)
    order_by: tuple[str, ...] = ()
    kind = "process"

    def describe(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "function": _function_name(self.function),
            "state": {name: str(descriptor.arrow_type) for name, descriptor in self.state.items()},
            "order_by": list(self.order_by),
        }


@dataclass(eq=False)
class SinkNode(Node):
    sink: Any = None
    kind = "sink"

    def describe(self) -> dict[str, Any]:
        return dict(self.sink.describe())


def sink_target(sink: Any) -> str:
    """Where a sink writes: its path, or its connector's name."""
    described = sink.describe()
    return str(described.get("path", described.get("connector", "sink")))


def _function_name(function: Callable[..., Any] | None) -> str:
    if function is None:
        return "?"
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def upstream_nodes(roots: Iterable[Node]) -> list[Node]:
    """Every node the roots depend on, inputs before consumers, each once."""
    ordered: list[Node] = []
    seen: set[int] = set()

    def visit(node: Node) -> None:
        if node.uid in seen:
            return
        seen.add(node.uid)
        for upstream in node.inputs:
            visit(upstream)
        ordered.append(node)

    for root in roots:
        visit(root)
    return ordered


def source_nodes(roots: Iterable[Node]) -> list[SourceNode]:
    """The sources the roots read from."""
    return [node for node in upstream_nodes(roots) if isinstance(node, SourceNode)]
