"""The job graph, serialisable to JSON (it is persisted next to state from the first run)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from keyflow.errors import PlanError
from keyflow.plan.state_schema import StateSchema

PLAN_FORMAT_VERSION = 3  # 2: operators carry a stable ``uid``; 3: keyed ones their typed ``state`` schema
READABLE_FORMAT_VERSIONS = (2, PLAN_FORMAT_VERSION)
KEYED_KINDS = frozenset({"aggregate", "process", "changelog_normalize"})  # in a plan of format version 2


class Partitioner(StrEnum):
    """How rows travel from one operator to the next."""

    FORWARD = "forward"  # same parallelism, subtask i feeds subtask i: chained, no exchange
    REBALANCE = "rebalance"  # round robin to a different parallelism
    HASH = "hash"  # by key group: subtask i receives exactly its key-group range
    BROADCAST = "broadcast"  # every subtask receives every row


@dataclass(frozen=True)
class Operator:
    """One operator: ``id`` wires the graph (creation order), ``uid`` names its state;
    ``details`` are what the plan shows, ``state`` and ``pre_keyed_by`` what runs and restores."""

    id: int
    uid: str
    name: str
    kind: str
    parallelism: int
    input_partitioner: Partitioner | None
    details: Mapping[str, Any] = field(default_factory=dict)
    state: StateSchema | None = None  # the keyed state it persists
    pre_keyed_by: tuple[str, ...] = ()  # a source read pre-keyed: the keys its splits are partitioned by

    @property
    def keyed(self) -> bool:
        """Whether it keeps keyed state by key group: a keyed operator, fed by a hash edge or,
        reinterpreted as keyed, by a forward one (a sink routed by its primary key keeps none)."""
        return self.state is not None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "uid": self.uid,
            "name": self.name,
            "kind": self.kind,
            "parallelism": self.parallelism,
            "input_partitioner": self.input_partitioner.value if self.input_partitioner else None,
            "details": dict(self.details),
        }
        if self.state is not None:
            data["state"] = self.state.to_dict()
        if self.pre_keyed_by:
            data["pre_keyed_by"] = list(self.pre_keyed_by)
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any], version: int) -> Operator:
        details = dict(data["details"])
        if version == 2:  # the state schema and pre-keyed keys were display details
            state = StateSchema.from_plan_v2(details) if data["kind"] in KEYED_KINDS else None
            pre_keyed_by = details.get("pre_keyed_by", ())
        else:
            state = StateSchema.from_dict(data["state"]) if "state" in data else None
            pre_keyed_by = data.get("pre_keyed_by", ())
        partitioner = data["input_partitioner"]
        return Operator(
            id=int(data["id"]),
            uid=str(data["uid"]),
            name=str(data["name"]),
            kind=str(data["kind"]),
            parallelism=int(data["parallelism"]),
            input_partitioner=Partitioner(partitioner) if partitioner else None,
            details=details,
            state=state,
            pre_keyed_by=tuple(pre_keyed_by),
        )


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
        return {
            "name": self.name,
            "max_parallelism": self.max_parallelism,
            "key_hash": self.key_hash,
            "default_parallelism": self.default_parallelism,
            "vertices": [
                {
                    "id": vertex.id,
                    "parallelism": vertex.parallelism,
                    "max_parallelism": vertex.max_parallelism,
                    "operators": [operator.to_dict() for operator in vertex.operators],
                }
                for vertex in self.vertices
            ],
            "edges": [
                {"source": e.source, "target": e.target, "partitioner": e.partitioner.value, "keys": list(e.keys)}
                for e in self.edges
            ],
            "format_version": PLAN_FORMAT_VERSION,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> JobGraph:
        version = data.get("format_version")
        if version not in READABLE_FORMAT_VERSIONS:
            raise PlanError(
                f"plan format_version {version!r} is not supported by this keyflow (it reads versions "
                f"{' and '.join(map(str, READABLE_FORMAT_VERSIONS))}); use the keyflow release that wrote it"
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
                    operators=tuple(Operator.from_dict(operator, version) for operator in vertex["operators"]),
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
                details = ", ".join(f"{key}={value}" for key, value in _shown(operator).items())
                uid = f" (uid {operator.uid})"
                lines.append(f"        {operator.kind}{uid}: {details}" if details else f"        {operator.kind}{uid}")
            for edge in self.edges:
                if edge.target == vertex.id:
                    keys = f" by {', '.join(edge.keys)}" if edge.keys else ""
                    lines.append(f"      <- [{edge.source}] {edge.partitioner.value}{keys}")
        return "\n".join(lines)


def _shown(operator: Operator) -> dict[str, Any]:
    """An operator's details as the plan shows them, with what its state depends on."""
    shown = dict(operator.details)
    if operator.pre_keyed_by:
        shown["pre_keyed_by"] = list(operator.pre_keyed_by)
    if operator.state is not None and operator.state.layout != "partials":
        shown["state_layout"] = operator.state.layout.value
    if operator.state is not None and operator.state.key_groups != "hash":
        shown["key_groups"] = operator.state.key_groups.value
    return shown
