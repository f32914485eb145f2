"""Compile a pipeline's operators into a plan. Pure: no Spark.

Decides every operator's parallelism and stable id, the number of key groups, the
partitioner on every edge, and which operators chain into one vertex (forward edge,
single input).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyflow.config import (
    AUTO_PARALLELISM,
    AUTO_PARALLELISM_ENABLED,
    AUTO_PARALLELISM_MAX,
    AUTO_PARALLELISM_MIN,
    DEFAULT_PARALLELISM,
    MAX_PARALLELISM,
    PIPELINE_NAME,
    SINK_KEYED_SHUFFLE,
    Config,
    auto_parallelism_bounds,
)
from keyflow.connectors.base import HasDeadLetters, SplitSource, changelog_mode
from keyflow.errors import KeyflowError, PlanError
from keyflow.keygroups import default_max_parallelism, split_key_groups
from keyflow.plan.columns import column_problems
from keyflow.plan.functions import ScalarFunction
from keyflow.plan.graph import Edge, JobGraph, Operator, Partitioner, Vertex
from keyflow.plan.nodes import (
    FilterNode,
    KeyedNode,
    LookupJoinNode,
    Node,
    ProcessNode,
    SinkNode,
    SourceNode,
    WithColumnsNode,
    keyed_origin,
    reads_unbounded,
    upstream,
    windowing_of,
)
from keyflow.plan.physical import KeyedOperator, lower_keyed
from keyflow.plan.state_schema import KeyGroupSource, StateSchema
from keyflow.plan.uids import assign_uids


@dataclass(frozen=True)
class CompiledPlan:
    """What runs: the job graph (parallelism, K, partitioners, uids), the nodes it was
    compiled from (functions, sources, sinks) by id, its roots and its configuration.

    The runtime reads everything from here, never from the user's ``Pipeline``.
    """

    graph: JobGraph
    nodes: Mapping[int, Node]
    roots: tuple[int, ...]
    config: Config
    physical: Mapping[int, KeyedOperator]  # each keyed node's physical kind, by node id
    streaming: bool  # it reads an unbounded source: the kinds keep state across micro-batches
    functions: Mapping[str, ScalarFunction] = field(default_factory=dict)  # callable by name in expressions

    def keyed_operator(self, node: KeyedNode, stateful: bool) -> KeyedOperator:
        """``node``'s physical kind, as compiled; lowered again only for a run of the other
        kind (``stateful`` differs from how the plan was compiled)."""
        return self.physical[node.id] if stateful == self.streaming else lower_keyed(node, stateful)

    @property
    def parallelism(self) -> int:
        return self.graph.default_parallelism

    @property
    def max_parallelism(self) -> int:
        return self.graph.max_parallelism

    @property
    def explicit_parallelism(self) -> dict[str, int]:
        """Operators whose parallelism the user set (a rescale keeps it), by uid."""
        return {self.uid(node.id): node.parallelism for node in self.nodes.values() if node.parallelism is not None}

    def operator(self, node_id: int) -> Operator:
        return self.graph.operator(node_id)

    def uid(self, node_id: int) -> str:
        return self.graph.operator(node_id).uid

    def is_keyed(self, node_id: int) -> bool:
        return self.graph.operator(node_id).keyed

    @property
    def sinks(self) -> list[SinkNode]:
        return [node for node in map(self.nodes.__getitem__, self.roots) if isinstance(node, SinkNode)]

    @property
    def sources(self) -> list[SourceNode]:
        return [node for node in self.nodes.values() if isinstance(node, SourceNode)]

    def pre_keyed_by(self, node_id: int) -> tuple[str, ...]:
        """The keys a source is read pre-keyed by (a ``reinterpret_as_keyed`` after it), or ()."""
        return self.operator(node_id).pre_keyed_by

    def reads_pre_keyed(self, node: Node) -> bool:
        """Whether ``node`` reinterprets a pre-keyed source (its rows carry their split's key group)."""
        if not (isinstance(node, KeyedNode) and node.reinterpreted):
            return False
        origin = keyed_origin(self.nodes, node.inputs[0])
        return isinstance(origin, SourceNode) and bool(self.pre_keyed_by(origin.id))

    def auto_sized(self) -> list[KeyedNode]:
        """Keyed operators a batch run with auto-parallelism sizes from their input: those
        with no parallelism of their own that are not reinterpreted (they follow their input)."""
        return [n for n in self.keyed_nodes().values() if n.parallelism is None and not n.reinterpreted]

    def keyed_nodes(self) -> dict[str, KeyedNode]:
        """The operators that keep keyed state, by uid."""
        return {self.uid(n.id): n for n in self.nodes.values() if isinstance(n, KeyedNode) and self.is_keyed(n.id)}

    def outputs(self) -> dict[str, tuple[str, Any]]:
        """Every sink a run writes to, dead-letter sinks included: uid -> (label, sink)."""
        found = {self.uid(sink.id): (sink.name, sink.sink) for sink in self.sinks}
        for source in self.sources:
            letters = source.source.dead_letters if isinstance(source.source, HasDeadLetters) else None
            if letters is not None:
                found[f"{self.uid(source.id)}/dead-letters"] = (f"dead letters of {source.name!r}", letters)
        for uid, node in self.keyed_nodes().items():
            if node.on_null is not None:
                found[f"{uid}/dead-letters"] = (f"dead letters of {node.name!r}", node.on_null)
            windowing = windowing_of(node)
            if windowing is not None and windowing.late_rows is not None:
                found[f"{uid}/late-rows"] = (f"late rows of {node.name!r}", windowing.late_rows)
        return found

    def with_config(self, values: Mapping[str, Any]) -> CompiledPlan:
        """The same operators compiled again with ``values`` on top of the configuration."""
        return compile_plan(self.nodes, self.roots, self.config.merged(values), self.functions)

    def rescaled(self, parallelism: int) -> CompiledPlan:
        """The same plan at another default parallelism; K stays (state lives in K key groups)
        and operators with an explicit parallelism keep it."""
        return self.with_config({DEFAULT_PARALLELISM.key: parallelism, MAX_PARALLELISM.key: self.max_parallelism})


def compile_plan(
    nodes: Mapping[int, Node],
    roots: Sequence[int],
    config: Config,
    functions: Mapping[str, ScalarFunction] | None = None,
) -> CompiledPlan:
    """The plan of everything ``roots`` (sinks, or a stream to collect) depend on."""
    ordered = upstream(nodes, roots)
    default = config.default_parallelism()
    config.s3_settings()  # the s3.* options that go together (a key without its secret) are checked here
    parallelism = {node.id: node.parallelism or default for node in ordered}
    streaming = reads_unbounded(ordered)
    physical, problems = _lowered(ordered, streaming)
    problems += column_problems(nodes, ordered)
    if not streaming:
        problems += _option_problems(config)
    try:
        max_parallelism = _max_parallelism(ordered, parallelism, config)
    except PlanError as error:
        raise PlanError(*problems, *error.problems) from None
    pre_keyed = _pre_keyed_sources(ordered, nodes)
    problems += _split_problems(pre_keyed, nodes, max_parallelism)
    if problems:
        raise PlanError(*problems)
    uids = assign_uids(ordered)

    consumers: dict[int, int] = {}
    for node in ordered:
        for input_id in node.inputs:
            consumers[input_id] = consumers.get(input_id, 0) + 1

    vertex_of: dict[int, int] = {}
    chains: list[list[Node]] = []
    edges: list[Edge] = []
    input_partitioner: dict[int, Partitioner | None] = {}
    for node in ordered:
        partitioners = [_partitioner(node, nodes, input_id, parallelism, config) for input_id in node.inputs]
        input_partitioner[node.id] = partitioners[0] if partitioners else None
        chainable = (
            len(node.inputs) == 1 and partitioners[0] is Partitioner.FORWARD and consumers.get(node.inputs[0]) == 1
        )
        if chainable:
            vertex = vertex_of[node.inputs[0]]
            chains[vertex].append(node)
        else:
            vertex = len(chains)
            chains.append([node])
            for position, (input_id, partitioner) in enumerate(zip(node.inputs, partitioners, strict=True)):
                keys = node.input_keys(position) if partitioner is Partitioner.HASH else ()
                edges.append(Edge(vertex_of[input_id], vertex, partitioner, keys))
        vertex_of[node.id] = vertex

    vertices = tuple(
        Vertex(
            id=index,
            parallelism=parallelism[chain[0].id],
            max_parallelism=max_parallelism,
            operators=tuple(
                Operator(
                    node.id,
                    uids[node.id],
                    node.name,
                    node.kind,
                    parallelism[node.id],
                    input_partitioner[node.id],
                    node.describe(),
                    _state_schema(node, nodes, pre_keyed, physical),
                    pre_keyed.get(node.id, ()),
                )
                for node in chain
            ),
        )
        for index, chain in enumerate(chains)
    )
    graph = JobGraph(
        name=config.get(PIPELINE_NAME),
        max_parallelism=max_parallelism,
        key_hash="spark",
        default_parallelism=default,
        vertices=vertices,
        edges=tuple(edges),
    )
    nodes_by_id = {node.id: node for node in ordered}
    return CompiledPlan(graph, nodes_by_id, tuple(roots), config, physical, streaming, dict(functions or {}))


def _lowered(ordered: list[Node], streaming: bool) -> tuple[dict[int, KeyedOperator], list[str]]:
    """Each keyed operator lowered to its physical kind, once; what cannot run (an aggregate
    state cannot merge or retract, an expression that is not SQL) is found here, before Spark."""
    physical: dict[int, KeyedOperator] = {}
    problems: list[str] = []
    for node in ordered:
        if isinstance(node, KeyedNode):
            try:
                physical[node.id] = lower_keyed(node, streaming)
            except PlanError as error:
                problems.extend(error.problems)
    return physical, problems


def _option_problems(config: Config) -> list[str]:
    """Options of a batch run that contradict each other, whatever the data."""
    if not config.get(AUTO_PARALLELISM_ENABLED):
        return []
    low, high = config.get(AUTO_PARALLELISM_MIN), config.get(AUTO_PARALLELISM_MAX)
    return [AUTO_PARALLELISM + auto_parallelism_bounds(low, high)] if high is not None and low > high else []


def _split_problems(
    pre_keyed: dict[int, tuple[str, ...]], nodes: Mapping[int, Node], max_parallelism: int
) -> list[str]:
    """A pre-keyed source needs a key group per split: more splits than key groups cannot run."""
    problems = []
    for source_id, keys in pre_keyed.items():
        source = nodes[source_id]
        assert isinstance(source, SourceNode)
        if not isinstance(source.source, SplitSource):
            continue  # refused by the reinterpret check, with its own message
        try:
            split_key_groups((), source.source.current_splits(), max_parallelism)
        except KeyflowError as error:
            problems.append(pre_keyed_problem(source.name, keys, error))
    return problems


def pre_keyed_problem(source: str, keys: Sequence[str], error: Exception) -> str:
    return f"source {source!r} (pre-keyed by {list(keys)}): {error}"


def _partitioner(
    node: Node, nodes: Mapping[int, Node], input_id: int, parallelism: dict[int, int], config: Config
) -> Partitioner:
    if isinstance(node, ProcessNode) and node.side_input and input_id == node.inputs[1]:
        return Partitioner.BROADCAST
    if isinstance(node, LookupJoinNode) and input_id == node.inputs[1]:
        return Partitioner.BROADCAST  # Spark's broadcast join where the table is small (else it shuffles both)
    if isinstance(node, KeyedNode) and node.reinterpreted:
        _check_reinterpretable(node, nodes, input_id, parallelism)
        return Partitioner.FORWARD
    if node.keyed:
        return Partitioner.HASH
    same = parallelism[node.id] == parallelism[input_id]
    if isinstance(node, SinkNode) and _sink_keyed_shuffle(node, same, parallelism[node.id], config):
        return Partitioner.HASH
    if same:
        return Partitioner.FORWARD
    _check_order_survives(node, nodes[input_id], parallelism[input_id], parallelism[node.id])
    return Partitioner.REBALANCE


def _pre_keyed_sources(ordered: list[Node], nodes: Mapping[int, Node]) -> dict[int, tuple[str, ...]]:
    """Sources read as pre-keyed streams: those a ``reinterpret_as_keyed`` reaches through
    row-keeping operators, with the keys it declares (one set of keys per source)."""
    found: dict[int, tuple[str, ...]] = {}
    for node in ordered:
        if not (isinstance(node, KeyedNode) and node.reinterpreted):
            continue
        origin = keyed_origin(nodes, node.inputs[0])
        if not isinstance(origin, SourceNode):
            continue
        if found.get(origin.id, node.keys) != node.keys:
            raise PlanError(
                f"source {origin.name!r} is reinterpreted as keyed by {list(found[origin.id])} and by "
                f"{list(node.keys)}; its splits are partitioned by one key. Reinterpret by that key and use "
                "key_by(...) for the other"
            )
        found[origin.id] = node.keys
    return found


def _state_schema(
    node: Node, nodes: Mapping[int, Node], pre_keyed: dict[int, tuple[str, ...]], physical: dict[int, KeyedOperator]
) -> StateSchema | None:
    """What a keyed operator persists. One reading a pre-keyed source keeps its state in its
    splits' key groups, not the key hash's, so a checkpoint cannot switch between the two."""
    if not isinstance(node, KeyedNode):
        return None
    reads_splits = node.reinterpreted and keyed_origin(nodes, node.inputs[0]).id in pre_keyed
    return physical[node.id].state_schema(KeyGroupSource.SPLITS if reads_splits else KeyGroupSource.HASH)


def _check_reinterpretable(
    node: KeyedNode, nodes: Mapping[int, Node], input_id: int, parallelism: dict[int, int]
) -> None:
    """``reinterpret_as_keyed`` holds only on the rows of a keyed operator on the same keys, or
    of a source split by key (a pre-keyed source), at its parallelism, through operators that
    keep rows where they are and keys as they are (filters, with_columns not writing a key)."""
    upstream = nodes[input_id]
    use = "use key_by(...) instead, which routes every row by its key group"
    while isinstance(upstream, (FilterNode, WithColumnsNode)):
        if parallelism[upstream.id] != parallelism[node.id]:
            raise PlanError(
                f"operator {node.name!r} reinterprets its input as keyed at parallelism {parallelism[node.id]}, but "
                f"{upstream.kind} {upstream.name!r} before it runs at {parallelism[upstream.id]} and rebalances the "
                f"rows; give it the same parallelism, or {use}"
            )
        written = set(upstream.columns) & set(node.keys) if isinstance(upstream, WithColumnsNode) else set()
        if written:
            raise PlanError(
                f"operator {node.name!r} reinterprets its input as keyed by {list(node.keys)}, but with_columns "
                f"{upstream.name!r} before it writes key column(s) {sorted(written)}, so rows may no longer be "
                f"where their keys belong; compute the key before the keyed operator that partitioned it, or {use}"
            )
        upstream = nodes[upstream.inputs[0]]
    what = f"operator {node.name!r} reinterprets its input as keyed by {list(node.keys)}, but"
    if isinstance(upstream, SourceNode):
        if not isinstance(upstream.source, SplitSource):
            raise PlanError(f"{what} source {upstream.name!r} has no splits partitioned by key (log(...) has); {use}")
        _check_pre_keyed_source(node, upstream, parallelism)
        return
    if not isinstance(upstream, KeyedNode):
        why = f"{upstream.kind} {upstream.name!r} may change the key columns"
        raise PlanError(
            f"{what} {why}; reinterpret_as_keyed follows a keyed operator (process, aggregate) or a log source; {use}"
        )
    if upstream.reinterpreted and isinstance(keyed_origin(nodes, upstream.inputs[0]), SourceNode):
        raise PlanError(
            f"{what} {upstream.kind} {upstream.name!r} before it reads a pre-keyed source, whose key groups come from "
            f"its splits, not from the key hash; do both steps in {upstream.name!r} (one process function), or {use}"
        )
    if tuple(upstream.keys) != tuple(node.keys):
        keyed_by = f"{upstream.name!r} is keyed by {list(upstream.keys)}"
        raise PlanError(f"{what} {keyed_by}; reinterpret on the same keys, or {use}")
    if parallelism[node.id] != parallelism[upstream.id]:
        raise PlanError(
            f"operator {node.name!r} reinterprets its input as keyed at parallelism {parallelism[node.id]}, but "
            f"{upstream.name!r} runs at {parallelism[upstream.id]}: its key groups would move between subtasks; "
            f"give both the same parallelism, or {use}"
        )


def _check_pre_keyed_source(node: KeyedNode, source: SourceNode, parallelism: dict[int, int]) -> None:
    """A pre-keyed source's subtask ``i`` reads the splits of key groups the keyed operator's
    subtask ``i`` owns: both run at one parallelism, and the log's changelog order holds."""
    if parallelism[node.id] != parallelism[source.id]:
        raise PlanError(
            f"operator {node.name!r} reinterprets source {source.name!r} as keyed at parallelism "
            f"{parallelism[node.id]}, but the source runs at {parallelism[source.id]}: its subtasks read the splits "
            "of the keyed operator's key groups, so give both the same parallelism (or neither an explicit one)"
        )
    if changelog_mode(source.source) != "insert":
        raise PlanError(
            f"operator {node.name!r} reinterprets changelog source {source.name!r} as keyed; a changelog is "
            "normalized by its primary key first, so reinterpret the stream after that, or use key_by(...)"
        )


def _sink_keyed_shuffle(sink: SinkNode, same_parallelism: bool, parallelism: int, config: Config) -> bool:
    """Flink's ``table.exec.sink.keyed-shuffle``: with a primary key, AUTO routes by it when
    the sink's parallelism differs from its input's, FORCE whenever it is not 1, NONE never."""
    if not sink.primary_key:
        return False
    mode = config.get(SINK_KEYED_SHUFFLE)
    return parallelism != 1 and ((mode == "AUTO" and not same_parallelism) or mode == "FORCE")


def _check_order_survives(node: Node, upstream: Node, before: int, after: int) -> None:
    """A rebalance would deliver the changes of one key to several subtasks, out of order."""
    changelog = isinstance(upstream, SourceNode) and changelog_mode(upstream.source) != "insert"
    if isinstance(node, SinkNode) and node.changelog and not node.primary_key:  # as Flink's CommonExecSink
        raise PlanError(
            f"sink {node.name!r} runs at parallelism {after} and its input {upstream.name!r} at {before}, and the "
            "input is a changelog: without a primary key its rows would be spread round robin and the changes of "
            f"one key could be applied out of order; {_DECLARE_KEY} on the sink, or give it the same parallelism"
        )
    if changelog:
        raise PlanError(
            f"source {upstream.name!r} is a changelog at parallelism {before} and {node.name!r} runs at {after}: "
            "without a primary key its rows would be spread round robin and the changes of one key could be "
            f"applied out of order; {_DECLARE_KEY} on the source, or give it the same parallelism"
        )


_DECLARE_KEY = "declare a primary key (SQL: PRIMARY KEY (...) NOT ENFORCED; Python: primary_key=...)"


def _max_parallelism(ordered: list[Node], parallelism: dict[int, int], config: Config) -> int:
    highest = max(parallelism.values())
    configured = config.get(MAX_PARALLELISM)
    if configured is None:
        try:
            return default_max_parallelism(highest)
        except ValueError:
            raise PlanError(f"parallelism {highest} is above the largest possible max parallelism 32768") from None
    for node in ordered:
        if parallelism[node.id] > configured:
            raise PlanError(
                f"operator {node.name!r} has parallelism {parallelism[node.id]}, above pipeline.max-parallelism "
                f"{configured}; lower its parallelism to at most {configured} or raise pipeline.max-parallelism"
            )
    return int(configured)
