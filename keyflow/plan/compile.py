"""Compile a pipeline's operators into a job graph. Pure: no Spark.

Decides every operator's parallelism, the number of key groups, the partitioner on every
edge, and which operators chain into one vertex (forward edge, single input).
"""

from __future__ import annotations

from collections.abc import Iterable

from keyflow.api import nodes
from keyflow.config import Config
from keyflow.errors import PlanError
from keyflow.keygroups import default_max_parallelism
from keyflow.plan.graph import Edge, JobGraph, Operator, Partitioner, Vertex


def compile_plan(roots: Iterable[nodes.Node], config: Config) -> JobGraph:
    """The job graph of everything ``roots`` (sinks, or a stream to collect) depend on."""
    ordered = nodes.upstream_nodes(roots)
    default = config.default_parallelism()
    parallelism = {node.uid: node.parallelism or default for node in ordered}
    max_parallelism = _max_parallelism(ordered, parallelism, config)

    consumers: dict[int, int] = {}
    for node in ordered:
        for upstream in node.inputs:
            consumers[upstream.uid] = consumers.get(upstream.uid, 0) + 1

    vertex_of: dict[int, int] = {}
    chains: list[list[nodes.Node]] = []
    edges: list[Edge] = []
    input_partitioner: dict[int, Partitioner | None] = {}
    for node in ordered:
        partitioners = [_partitioner(node, upstream, parallelism) for upstream in node.inputs]
        input_partitioner[node.uid] = partitioners[0] if partitioners else None
        chainable = (
            len(node.inputs) == 1
            and partitioners[0] is Partitioner.FORWARD
            and consumers.get(node.inputs[0].uid, 0) == 1
        )
        if chainable:
            vertex = vertex_of[node.inputs[0].uid]
            chains[vertex].append(node)
        else:
            vertex = len(chains)
            chains.append([node])
            for upstream, partitioner in zip(node.inputs, partitioners, strict=True):
                keys = node.keys if isinstance(node, nodes.KeyedNode) else ()
                edges.append(Edge(vertex_of[upstream.uid], vertex, partitioner, keys))
        vertex_of[node.uid] = vertex

    vertices = tuple(
        Vertex(
            id=index,
            parallelism=parallelism[chain[0].uid],
            max_parallelism=max_parallelism,
            operators=tuple(
                Operator(
                    node.uid,
                    node.name,
                    node.kind,
                    parallelism[node.uid],
                    _value(input_partitioner[node.uid]),
                    node.describe(),
                )
                for node in chain
            ),
        )
        for index, chain in enumerate(chains)
    )
    return JobGraph(
        name=str(config["pipeline.name"]),
        max_parallelism=max_parallelism,
        key_hash="spark",
        default_parallelism=default,
        vertices=vertices,
        edges=tuple(edges),
    )


def _value(partitioner: Partitioner | None) -> str | None:
    return partitioner.value if partitioner else None


def _partitioner(node: nodes.Node, upstream: nodes.Node, parallelism: dict[int, int]) -> Partitioner:
    if isinstance(node, nodes.KeyedNode):
        return Partitioner.HASH
    if parallelism[node.uid] == parallelism[upstream.uid]:
        return Partitioner.FORWARD
    return Partitioner.REBALANCE


def _max_parallelism(ordered: list[nodes.Node], parallelism: dict[int, int], config: Config) -> int:
    highest = max(parallelism.values())
    configured = config["pipeline.max-parallelism"]
    if configured is None:
        try:
            return default_max_parallelism(highest)
        except ValueError:
            raise PlanError(f"parallelism {highest} is above the largest possible max parallelism 32768") from None
    for node in ordered:
        if parallelism[node.uid] > configured:
            raise PlanError(
                f"operator {node.name!r} has parallelism {parallelism[node.uid]}, above pipeline.max-parallelism "
                f"{configured}; lower its parallelism to at most {configured} or raise pipeline.max-parallelism"
            )
    return int(configured)
