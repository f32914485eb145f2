"""The job graph, serialisable to JSON (it is persisted next to state from the first run)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from keyflow.errors import PlanError

KEYED_KINDS = frozenset({"aggregate", "process", "changelog_normalize"})
PLAN_FORMAT_VERSION = 2  # 2: operators carry a stable ``uid`` (a string) beside their ``id``


class Partitioner(StrEnum):
    """How rows travel from one operator to the next."""

    FORWARD = "forward"  # same parallelism, subtask i feeds subtask i: chained, no exchange
    REBALANCE = "rebalance"  # round robin to a different parallelism
    HASH = "hash"  # by key group: subtask i receives exactly its key-group range
    BROADCAST = "broadcast"  # every subtask receives every row


@dataclass(frozen=True)
class Operator:
    """One operator: ``id`` wires the graph (creation order), ``uid`` names its state."""

    id: int
    uid: str
    name: str
    kind: str
    parallelism: int
    input_partitioner: str | None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def keyed(self) -> bool:
        """Whether it keeps keyed state by key group: a keyed operator, fed by a hash edge or,
        reinterpreted as keyed, by a forward one (a sink routed by its primary key keeps none)."""
        return self.kind in KEYED_KINDS


@dataclass(frozen=True)
class Vertex:
    """A chain of operators that run together in one Spark stage, at one parallelism."""

    id: int
    parallelism: int
    max_parallelism: int
    operators: tuple[Operator, ...]

    @property
    def name(self) -> str:
        return " -> ".join(operator.name for operator in self.operators)


@dataclass(frozen=True)
class Edge:
    source: int
    target: int
    partitioner: Partitioner
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobGraph:
    name: str
    max_parallelism: int
    key_hash: str
    default_parallelism: int
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...]

    @property
    def operators(self) -> tuple[Operator, ...]:
        return tuple(operator for vertex in self.vertices for operator in vertex.operators)

    def operator(self, operator_id: int) -> Operator:
        for operator in self.operators:
            if operator.id == operator_id:
                return operator
        raise KeyError(operator_id)

    def keyed_operators(self) -> dict[str, Operator]:
        """The operators that keep keyed state, by uid."""
        return {operator.uid: operator for operator in self.operators if operator.keyed}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format_version"] = PLAN_FORMAT_VERSION
        for edge in data["edges"]:
            edge["partitioner"] = edge["partitioner"].value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> JobGraph:
        version = data.get("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise PlanError(
                f"plan format_version {version!r} is not supported by this keyflow (it reads version "
                f"{PLAN_FORMAT_VERSION}); use the keyflow release that wrote it"
            )
        return JobGraph(
            name=data["name"],
            max_parallelism=int(data["max_parallelism"]),
            key_hash=data["key_hash"],
            default_parallelism=int(data["default_parallelism"]),
            vertices=tuple(
                Vertex(
                    id=vertex["id"],
                    parallelism=vertex["parallelism"],
                    max_parallelism=vertex["max_parallelism"],
                    operators=tuple(Operator(**operator) for operator in vertex["operators"]),
                )
                for vertex in data["vertices"]
            ),
            edges=tuple(
                Edge(edge["source"], edge["target"], Partitioner(edge["partitioner"]), tuple(edge["keys"]))
                for edge in data["edges"]
            ),
        )

    def render(self) -> str:
        """A readable, indented text form of the plan."""
        lines = [
            f"pipeline {self.name!r}: max parallelism {self.max_parallelism} key groups, "
            f"key hash {self.key_hash}, default parallelism {self.default_parallelism}"
        ]
        for vertex in self.vertices:
            lines.append(f"  [{vertex.id}] parallelism {vertex.parallelism}: {vertex.name}")
            for operator in vertex.operators:
                details = ", ".join(f"{key}={value}" for key, value in operator.details.items())
                uid = f" (uid {operator.uid})"
                lines.append(f"        {operator.kind}{uid}: {details}" if details else f"        {operator.kind}{uid}")
            for edge in self.edges:
                if edge.target == vertex.id:
                    keys = f" by {', '.join(edge.keys)}" if edge.keys else ""
                    lines.append(f"      <- [{edge.source}] {edge.partitioner.value}{keys}")
        return "\n".join(lines)
