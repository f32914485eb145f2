"""The columns each operator outputs, where the plan can tell without Spark; the checks on them.

Sources that know their columns before reading (the log, datagen) let the plan find a
misspelt key, ``order_by``, sink primary key or aggregate column, a column an expression of
``select``/``filter``/``with_columns`` reads but its input lacks, and a ``sum``/``avg`` of a
column Spark refuses to add (boolean, date, array, struct, map) before a SparkSession starts.
Where an operator's output cannot be told (a ``map_batches`` without a schema, a select of
computed expressions Spark names itself) nothing after it is checked here, and an expression
sqlglot cannot read is passed on: Spark checks both.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from sqlglot import exp

from keyflow.changelog import OP
from keyflow.connectors.base import KnowsColumns, KnowsTypes
from keyflow.plan.aggregates import AggregateCall, parse_aggregations, parse_expression, read_columns
from keyflow.plan.nodes import (
    WINDOW_END,
    WINDOW_START,
    AggregateNode,
    ConnectedNode,
    CoProcessNode,
    FilterNode,
    JoinNode,
    KeyedNode,
    LookupJoinNode,
    MapBatchesNode,
    Node,
    NormalizeNode,
    OverNode,
    ProcessNode,
    RankNode,
    SelectNode,
    SinkNode,
    SourceNode,
    UnionNode,
    WindowAggregateNode,
    WindowJoinNode,
    WindowProcessNode,
    WindowTableRankNode,
    WithColumnsNode,
    event_time_column,
)
from keyflow.schemas import Type, schema_columns

Columns = dict[str, Type] | None  # each column's type; None: the columns are not known before Spark runs

NOT_SUMMABLE = ("boolean", "date", "array", "struct", "map")  # Spark 4 refuses sum/avg of these (strings it casts)
NILADIC = {"user", "current_user", "session_user", "current_catalog", "current_database", "current_schema",
           "current_date", "current_timestamp", "current_time", "localtimestamp"}  # fmt: skip
"""Names Spark reads as a function call where no column has them (``select current_date``)."""


def output_columns(nodes: Mapping[int, Node], node_id: int, known: dict[int, Columns]) -> Columns:
    """The columns ``node_id`` outputs, or None; ``known`` caches what was found."""
    if node_id not in known:
        known[node_id] = _output(nodes, nodes[node_id], known)
    return known[node_id]


def _output(nodes: Mapping[int, Node], node: Node, known: dict[int, Columns]) -> Columns:
    if isinstance(node, SourceNode):
        return _source_columns(node.source)
    if isinstance(node, (MapBatchesNode, ProcessNode, WindowProcessNode, CoProcessNode)):
        return schema_columns(node.schema)
    if isinstance(node, UnionNode):
        return _union_columns([output_columns(nodes, input_id, known) for input_id in node.inputs])
    if isinstance(node, (JoinNode, LookupJoinNode)):
        return _joined_columns(node, *(output_columns(nodes, input_id, known) for input_id in node.inputs))
    upstream = output_columns(nodes, node.inputs[0], known) if node.inputs else None
    if upstream is None:
        return None
    if isinstance(node, FilterNode):
        return upstream
    if isinstance(node, WithColumnsNode):
        return {**upstream, **dict.fromkeys(node.columns)}  # a replaced column keeps its place
    if isinstance(node, SelectNode):
        return _selected(node.expressions, upstream)
    if isinstance(node, WindowAggregateNode):
        return {**{key: upstream.get(key) for key in node.keys}, **dict.fromkeys(node.output_names()[len(node.keys) :])}
    if isinstance(node, AggregateNode):
        keys = {key: upstream.get(key) for key in node.keys}
        return {**keys, **dict.fromkeys(node.aggregations), **({OP: "string"} if node.changelog else {})}
    if isinstance(node, WindowTableRankNode):
        ranked = {node.rank_column: "bigint"} if node.rank_column else {}
        return {**upstream, WINDOW_START: "timestamp", WINDOW_END: "timestamp", **ranked}
    if isinstance(node, RankNode):
        ranked = {node.rank_column: "bigint"} if node.rank_column else {}
        return {**upstream, **ranked, **({OP: "string"} if node.changelog else {})}
    if isinstance(node, OverNode):
        return {**upstream, **dict.fromkeys(node.aggregations)}
    if isinstance(node, NormalizeNode):
        return None  # internal columns (offsets, deletes) are dropped at run time
    return upstream


def event_time_at(nodes: Mapping[int, Node], node_id: int) -> str | None:
    """The name the event-time column (the source's watermark column) has in ``node_id``'s
    rows, followed through selects that rename it (``ts AS bid_time``); None where a select
    drops it or the rows have no event time (see ``nodes.event_time_column``)."""
    node = nodes[node_id]
    if isinstance(node, SelectNode):
        before = event_time_at(nodes, node.inputs[0])
        if before is None:
            return None
        for expression in node.expressions:
            tree = parse_expression(expression)
            if isinstance(tree, exp.Star) or (tree is not None and _names(tree, before)):
                return before
            if isinstance(tree, exp.Alias) and _names(tree.this, before):
                return str(tree.alias)
        return None
    if isinstance(node, (SourceNode, UnionNode, ConnectedNode)) or not node.inputs:
        return event_time_column(nodes, node_id)
    return event_time_at(nodes, node.inputs[0])


def _names(tree: exp.Expr, column: str) -> bool:
    """Whether ``tree`` is the plain column ``column`` (as Spark resolves names: any case)."""
    return isinstance(tree, exp.Column) and not tree.is_star and not tree.table and tree.name.lower() == column.lower()


def _joined_columns(node: JoinNode | LookupJoinNode, left: Columns, right: Columns) -> Columns:
    """A join's columns: the keys (named as the left input's), the left input's other columns,
    the right input's other columns (and ``op`` for an outer join)."""
    if left is None or right is None:
        return None
    window = {WINDOW_START: "timestamp", WINDOW_END: "timestamp"} if isinstance(node, WindowJoinNode) else {}
    keys = {key: left.get(key) for key in node.keys}
    joined = {**keys, **window, **left, **{name: kind for name, kind in right.items() if name not in node.other_keys}}
    return {**joined, **({OP: "string"} if node.changelog else {})}


def join_clashes(other_keys: Sequence[str], left: Sequence[str], right: Sequence[str]) -> list[str]:
    """Right columns besides its keys that the left input has too: the output would hold two
    (not ``op``: a join of two changelogs reads their row kinds and writes its own)."""
    return [name for name in right if name not in other_keys and name in left and name != OP]


def join_clash_message(name: str, clashes: list[str]) -> str:
    return (
        f"join {name!r}: both streams have column(s) {clashes} besides the keys, and the output would hold "
        "two of each; rename them on one side with select('x AS right_x', ...) first"
    )


def window_clash_message(name: str, clashes: list[str]) -> str:
    return (
        f"window join {name!r}: an input has column(s) {clashes}, which the join adds to its output; rename them "
        "with select('window_start AS earlier_start', ...) first"
    )


def _union_columns(inputs: list[Columns]) -> Columns:
    """A union's columns: its first input's, each with the type its inputs agree on (if known)."""
    if any(columns is None for columns in inputs):
        return None
    first = inputs[0]
    assert first is not None
    return {name: _agreed([columns.get(name) for columns in inputs if columns is not None]) for name in first}


def _agreed(types: list[Type]) -> Type:
    return types[0] if len(set(types)) == 1 else None


def union_problems(nodes: Mapping[int, Node], input_ids: Sequence[int]) -> list[str]:
    """Inputs of a union whose columns differ (by name; by type where both are known) from the first's."""
    known: dict[int, Columns] = {}
    first_id, *others = input_ids
    first = output_columns(nodes, first_id, known)
    problems = []
    for other_id in others:
        columns = output_columns(nodes, other_id, known)
        if first is None or columns is None:
            continue  # Spark checks what the plan cannot tell
        a, b = nodes[first_id].name, nodes[other_id].name
        only_a, only_b = [c for c in first if c not in columns], [c for c in columns if c not in first]
        if only_a or only_b:
            problems.append(
                f"union(...): {a!r} and {b!r} have different columns: only {a!r} has {only_a}, only {b!r} has "
                f"{only_b}; select or rename the columns so both have the same names"
            )
            continue
        typed = [c for c in first if first[c] and columns[c] and first[c] != columns[c]]
        if typed:
            differ = ", ".join(f"{c} ({first[c]} vs {columns[c]})" for c in typed)
            problems.append(
                f"union(...): {a!r} and {b!r} have columns of different types: {differ}; cast them to one type "
                "with select(...) first"
            )
    return problems


def _source_columns(source: object) -> Columns:
    names = source.column_names() if isinstance(source, KnowsColumns) else None
    if names is None:
        return None
    types = source.column_types() if isinstance(source, KnowsTypes) else {}
    return {name: types.get(name) for name in names}


def _selected(expressions: tuple[str, ...], upstream: dict[str, Type]) -> Columns:
    columns: dict[str, Type] = {}
    spelled = {name.lower(): name for name in upstream}  # Spark keeps the input's spelling
    for expression in expressions:
        tree = parse_expression(expression)
        if isinstance(tree, exp.Star):
            columns.update(upstream)
        elif isinstance(tree, exp.Alias):
            columns[tree.alias] = None
        elif isinstance(tree, exp.Column) and not tree.is_star and not tree.table:
            name = spelled.get(tree.name.lower(), tree.name)
            columns[name] = upstream.get(name)
        else:
            return None  # not SQL sqlglot reads, s.*, s.field, computed: named by Spark
    return columns


def column_problems(nodes: Mapping[int, Node], ordered: list[Node]) -> list[str]:
    """Every column an operator names or reads that is missing from what reaches it, and
    every ``sum``/``avg`` of a column whose type Spark refuses."""
    known: dict[int, Columns] = {}
    problems: list[str] = []
    for node in ordered:
        available = output_columns(nodes, node.inputs[0], known) if node.inputs else None
        if isinstance(node, (ConnectedNode, LookupJoinNode)):
            problems.extend(_connected_problems(nodes, node, available, known))
            continue
        if available is None or isinstance(node, NormalizeNode):
            continue
        if isinstance(node, KeyedNode):
            problems.extend(_keyed_problems(node, available))
        elif isinstance(node, SinkNode) and (missing := [k for k in node.primary_key if k not in available]):
            problems.append(missing_primary_key_message(node, missing, list(available)))
        elif not (isinstance(node, FilterNode) and _sees_dropped_columns(nodes, node)):
            problems.extend(_expression_problems(node, available))
    return problems


def _keyed_problems(node: KeyedNode, available: dict[str, Type]) -> list[str]:
    problems = []
    missing_keys = [key for key in node.keys if key not in available]
    if missing_keys:
        problems.append(missing_key_message(node, missing_keys, list(available)))
    if isinstance(node, ProcessNode):
        problems.extend(missing_order_by_message(node, c, list(available)) for c in node.order_by if c not in available)
    if isinstance(node, AggregateNode):
        problems.extend(_aggregate_problems(node, available))
    if isinstance(node, RankNode):
        problems.extend(
            f"operator {node.name!r} orders by column {column!r}, which is not among its input's columns "
            f"{list(available)}"
            for column, _ in node.order
            if column not in available
        )
        if node.rank_column in available:
            problems.append(
                f"operator {node.name!r}: its row number column {node.rank_column!r} has the name of an input "
                "column; name it otherwise"
            )
    return problems


def _connected_problems(
    nodes: Mapping[int, Node], node: ConnectedNode | LookupJoinNode, first: Columns, known: dict[int, Columns]
) -> list[str]:
    """Each input's key columns are there, and pairwise of one type where both are known (the
    type decides the key group: keys of two types never meet)."""
    second = output_columns(nodes, node.inputs[1], known)
    problems = []
    for position, available in enumerate((first, second)):
        missing = [key for key in node.input_keys(position) if available is not None and key not in available]
        if missing:
            stream = nodes[node.inputs[position]].name
            problems.append(
                f"operator {node.name!r}: the {('first', 'second')[position]} stream ({stream!r}) has no key column(s) "
                f"{missing}; its columns: {list(available or ())}"
            )
    if problems or first is None or second is None:
        return problems
    for key, other in zip(node.keys, node.other_keys, strict=True):
        if first[key] and second[other] and first[key] != second[other]:
            problems.append(
                f"operator {node.name!r}: key {key!r} of {nodes[node.inputs[0]].name!r} is {first[key]} but key "
                f"{other!r} of {nodes[node.inputs[1]].name!r} is {second[other]}; equal keys of two types never meet "
                "in one key group: cast one of them with select(...) first"
            )
    return problems


def _aggregate_problems(node: AggregateNode, available: dict[str, Type]) -> list[str]:
    calls = parse_aggregations(node.aggregations)  # an unreadable one reads no known columns
    lowered = {name.lower(): kind for name, kind in available.items()}  # Spark resolves columns case-insensitively
    known = lowered.keys() | NILADIC  # functions Spark calls without parentheses read no column
    problems = [
        f"operator {node.name!r}: aggregate {call.name}={call.expression!r} reads column(s) {missing}, which "
        f"are not among its input's columns {list(available)}"
        for call in calls
        if (missing := sorted(c for c in call.columns if c.lower() not in known))
    ]
    return problems + [
        f"operator {node.name!r}: aggregate {call.name}={call.expression!r} adds up column {call.argument!r} of "
        f"type {kind}, which Spark refuses (it needs a number); cast it in with_columns(...) before, or aggregate "
        "another column"
        for call in calls
        if (kind := _summed_type(call, lowered)) in NOT_SUMMABLE
    ]


def _summed_type(call: AggregateCall, lowered: Mapping[str, Type]) -> Type:
    """The type of the column a ``sum``/``avg`` adds up, where its argument is one column."""
    if call.function not in ("sum", "avg", "mean") or len(call.arguments) != 1:
        return None
    return lowered.get(call.arguments[0].strip("`").lower())


def _expression_problems(node: Node, available: dict[str, Type]) -> list[str]:
    """Columns the expressions of a select, filter or with_columns read that its input lacks.
    A name the operator defines itself counts as known: Spark resolves a lateral alias."""
    if isinstance(node, SelectNode):
        texts, defined = node.expressions, set[str]()
    elif isinstance(node, WithColumnsNode):
        texts, defined = tuple(node.columns.values()), set(node.columns)
    elif isinstance(node, FilterNode):
        texts, defined = (node.condition,), set()
    else:
        return []
    trees = {text: tree for text in texts if (tree := parse_expression(text)) is not None and not tree.find(exp.Select)}
    defined |= {tree.alias for tree in trees.values() if isinstance(tree, exp.Alias)}
    known = {name.lower() for name in (*available, *defined, *NILADIC)}
    return [
        unknown_column_message(node, text, column, list(available))
        for text, tree in trees.items()
        for column in sorted(read_columns(tree))
        if column.lower() not in known
    ]


def _sees_dropped_columns(nodes: Mapping[int, Node], node: FilterNode) -> bool:
    """Whether Spark may resolve the filter's columns below its input: a filter over a select
    or an aggregate (through filters and with_columns) reads columns those dropped."""
    upstream = nodes[node.inputs[0]]
    while isinstance(upstream, (FilterNode, WithColumnsNode)):
        upstream = nodes[upstream.inputs[0]]
    return isinstance(upstream, (SelectNode, AggregateNode))


def unknown_column_message(node: Node, expression: str, column: str, available: list[str]) -> str:
    close = difflib.get_close_matches(column, available, n=1)
    fix = f"did you mean {close[0]!r}?" if close else "name a column of its input"
    return (
        f"operator {node.name!r} ({node.kind}): {expression!r} reads column {column!r}, which is not among its "
        f"input's columns {available}; {fix}"
    )


def missing_primary_key_message(node: SinkNode, missing: list[str], available: list[str]) -> str:
    return (
        f"sink {node.name!r}: primary key column(s) {missing} are not among its input's columns "
        f"{available}; name columns of the stream in primary_key"
    )


def missing_key_message(node: KeyedNode, missing: list[str], available: list[str]) -> str:
    """The error for key columns that are not in an operator's input."""
    if node.reinterpreted:
        return (
            f"operator {node.name!r}: reinterpret_as_keyed column(s) {missing} are not in the rows of the operator "
            f"before it ({list(available)}); keep the key columns in its output, or use key_by(...)"
        )
    return f"operator {node.name!r}: key_by column(s) {missing} not found; available columns: {list(available)}"


def missing_order_by_message(node: ProcessNode, column: str, available: list[str]) -> str:
    return f"operator {node.name!r}: order_by column {column!r} not found in {list(available)}"
