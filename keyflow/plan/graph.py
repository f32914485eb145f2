"""The job graph, serialisable to JSON (it is persisted next to state from the first run)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

PLAN_FORMAT_VERSION = 1


class Partitioner(StrEnum):
    """How rows travel from one operator to the next."""

    FORWARD = "forward"  # same parallelism, subtask i feeds subtask i: chained, no exchange
    REBALANCE = "rebalance"  # round robin to a different parallelism
    HASH = "hash"  # by key group: subtask i receives exactly its key-group range
    BROADCAST = "broadcast"  # every subtask receives every row


@dataclass(frozen=True)
class Operator:
    uid: int
    name: str
    kind: str
    parallelism: int
    input_partitioner: str | None
    details: dict[str, Any] = field(default_factory=dict)


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

    def vertex_of(self, uid: int) -> Vertex:
        for vertex in self.vertices:
            if any(operator.uid == uid for operator in vertex.operators):
                return vertex
        raise KeyError(uid)

    def operator(self, uid: int) -> Operator:
        for operator in self.vertex_of(uid).operators:
            if operator.uid == uid:
                return operator
        raise KeyError(uid)

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
            raise ValueError(
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
                lines.append(f"        {operator.kind}: {details}" if details else f"        {operator.kind}")
            for edge in self.edges:
                if edge.target == vertex.id:
                    keys = f" by {', '.join(edge.keys)}" if edge.keys else ""
                    lines.append(f"      <- [{edge.source}] {edge.partitioner.value}{keys}")
        return "\n".join(lines)
