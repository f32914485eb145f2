"""SQL statements onto a :class:`~keyflow.Pipeline`: the same plan nodes the Python API adds.

``FROM`` reads a table's source (once per pipeline, whatever number of queries read it),
``WHERE`` is a filter, ``GROUP BY`` a keyed aggregate (a retracting one, emitting a
changelog, when the input is unbounded), the select list a projection cast to the sink's
column types. Expressions are transpiled to Spark SQL by sqlglot and run as Spark expressions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlglot import exp

from keyflow.api.stream import Stream
from keyflow.changelog import OP
from keyflow.plan import nodes
from keyflow.plan.compile import compile_plan
from keyflow.sql.options import check_options, parallelism_option
from keyflow.sql.statements import DIALECT, CreateTable, Insert, Query, SetOption, SqlError, parse_script, position
from keyflow.sql.tables import quoted, sink_of, source_of

if TYPE_CHECKING:
    from keyflow.api.pipeline import Pipeline

AGGREGATES = {exp.Count: "COUNT", exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX"}
_UNSUPPORTED = {
    "joins": "JOIN",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "distinct": "SELECT DISTINCT",
    "with_": "WITH (common table expressions)",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
    "laterals": "LATERAL VIEW",
}


@dataclass
class Catalog:
    """The tables a pipeline's SQL knows: declared ones and Python streams registered as views."""

    tables: dict[str, CreateTable] = field(default_factory=dict)
    views: dict[str, int] = field(default_factory=dict)  # name -> node id of a stream
    read: dict[str, int] = field(default_factory=dict)  # table -> node id of its source stream
    written: set[str] = field(default_factory=set)


@dataclass
class Planned:
    """What a script did: the rendered plans of its EXPLAINs, the stream of a final bare
    SELECT, how many INSERTs it added."""

    explained: list[str] = field(default_factory=list)
    stream: Stream | None = None
    inserts: int = 0


def plan_script(pipeline: Pipeline, text: str) -> Planned:
    """Parse ``text`` and add what it says to ``pipeline``."""
    catalog = pipeline.catalog
    planned = Planned()
    for statement in parse_script(text):
        if isinstance(statement, SetOption):
            pipeline.set_option(statement.key, statement.value)
        elif isinstance(statement, CreateTable):
            if statement.name in catalog.tables or statement.name in catalog.views:
                raise SqlError(f"{statement.where} is declared twice; give the second another name")
            check_options(statement)
            catalog.tables[statement.name] = statement
        elif isinstance(statement, Insert):
            sink_id = _insert(pipeline, catalog, statement)
            if statement.explain:
                planned.explained.append(compile_plan(pipeline.operators, (sink_id,), pipeline.config).graph.render())
            else:
                pipeline.add_sink(sink_id)
                planned.inserts += 1
        elif isinstance(statement, Query):
            planned.stream = _select(pipeline, catalog, statement.query, "query")[0]
    return planned


def _insert(pipeline: Pipeline, catalog: Catalog, statement: Insert) -> int:
    table = catalog.tables.get(statement.target)
    if table is None:
        raise SqlError(f"INSERT INTO {statement.target} ({statement.where}): no table {statement.target!r}; "
                       f"declare it with CREATE TABLE {statement.target} (…) WITH (…) first")  # fmt: skip
    if not statement.explain:
        if table.name in catalog.written:
            raise SqlError(f"{table.where} is written by two INSERT statements; write each sink table once")
        catalog.written.add(table.name)
    sink = sink_of(table)
    stream, names = _select(pipeline, catalog, statement.query, table.name)
    if len(names) != len(table.columns):
        raise SqlError(
            f"INSERT INTO {table.name} ({statement.where}) selects {len(names)} column(s) {names}; the table has "
            f"{len(table.columns)}: {table.column_names}; select them in that order"
        )
    changelog = stream.is_changelog
    casts = [f"CAST({quoted(n)} AS {c.type}) AS {quoted(c.name)}" for n, c in zip(names, table.columns, strict=True)]
    stream = stream.select(*casts, *([OP] if changelog else []), name=f"to {table.name}")
    parallelism = parallelism_option(table, "sink.parallelism", pipeline.config["pipeline.max-parallelism"])
    return pipeline.add(
        nodes.SinkNode,
        (stream.node_id,),
        f"sink: {table.name}",
        parallelism,
        sink=sink,
        primary_key=table.primary_key,
        changelog=changelog,
    )


def _select(pipeline: Pipeline, catalog: Catalog, query: exp.Select, into: str) -> tuple[Stream, list[str]]:
    """The stream of ``query`` and the names of its columns (a changelog's ``op`` aside).
    Its operators are named after ``into`` (the sink table), so their ids stay stable."""
    for arg, construct in _UNSUPPORTED.items():
        if query.args.get(arg):
            at = position(query.args[arg] if arg != "distinct" else query)
            raise SqlError(f"{construct} at {at} is not supported in keyflow SQL{_HINTS.get(arg, '')}")
    source = query.args.get("from_") or query.args.get("from")
    if source is None or not isinstance(source.this, exp.Table) or not source.this.name:
        raise SqlError(f"SELECT at {position(query)} must read FROM one table (subqueries and table functions are "
                       "not supported)")  # fmt: skip
    table_node = source.this
    if table_node.args.get("joins") or any(isinstance(n, exp.Join) for n in source.walk()):
        raise SqlError(f"JOIN at {position(source)} is not supported in keyflow SQL")
    _refuse_windows(query)
    name = table_node.name
    stream, columns = _read(pipeline, catalog, name)
    _unqualify(query, {name, table_node.alias_or_name})
    where = query.args.get("where")
    if where is not None:
        if any(isinstance(n, exp.AggFunc) for n in where.walk()):
            raise SqlError(f"an aggregate in WHERE at {position(where)}; filter aggregates with HAVING")
        stream = stream.filter(where.this.sql(dialect=DIALECT), name=f"where ({into})")
    expressions = _expand_star(query.expressions, columns)
    grouped = query.args.get("group")
    if grouped is not None or any(isinstance(n, exp.AggFunc) for e in expressions for n in e.walk()):
        return _aggregate(pipeline, stream, query, expressions, into)
    if query.args.get("having") is not None:
        raise SqlError(f"HAVING at {position(query.args['having'])} needs GROUP BY or an aggregate")
    names = _output_names(expressions)
    projected = [f"{e.unalias().sql(dialect=DIALECT)} AS {quoted(n)}" for e, n in zip(expressions, names, strict=True)]
    if stream.is_changelog:
        projected.append(OP)
    return stream.select(*projected, name=f"select ({into})"), names


_HINTS = {
    "joins": "; join in Spark before writing the input, or in a process function with state",
    "windows": "; windows are not supported yet",
    "order": "; a stream has no order (sort the output where you read it)",
    "distinct": "; use GROUP BY over the columns instead",
}


def _refuse_windows(query: exp.Select) -> None:
    for node in query.walk():
        if isinstance(node, exp.Window):
            raise SqlError(f"OVER (window) at {position(node)} is not supported in keyflow SQL")
        if isinstance(node, exp.Subquery) or (isinstance(node, exp.Select) and node is not query):
            raise SqlError(f"a subquery at {position(node)} is not supported in keyflow SQL")
        if isinstance(node, exp.Anonymous) and node.name.upper() in ("TUMBLE", "HOP", "SESSION", "CUMULATE"):
            raise SqlError(f"window function {node.name.upper()} at {position(node)} is not supported in keyflow SQL")


def _read(pipeline: Pipeline, catalog: Catalog, name: str) -> tuple[Stream, list[str] | None]:
    """The stream of table or view ``name`` (its source is added once) and its columns if known."""
    if name in catalog.views:
        view = Stream(pipeline, catalog.views[name])
        if _upserts_without_row_kinds(pipeline, view.node_id):
            raise SqlError(
                f"view {name!r} is a streaming aggregate of the Python API: it emits each changed key's new value "
                "without row kinds, so SQL cannot retract the old one; aggregate in SQL (GROUP BY) instead, or "
                "register the stream before the aggregate"
            )
        return view, None
    table = catalog.tables.get(name)
    if table is None:
        known = ", ".join(sorted([*catalog.tables, *catalog.views])) or "none"
        raise SqlError(f"no table {name!r} to read FROM (declared: {known}); declare it with CREATE TABLE")
    if name not in catalog.read:
        source = source_of(table)
        config = pipeline.config
        parallelism = parallelism_option(table, "scan.parallelism", config["pipeline.max-parallelism"])
        mode = getattr(source, "changelog_mode", "insert")
        if mode != "insert" and not table.primary_key and parallelism is not None:
            # As Flink: a configured source parallelism routes a changelog by its primary key, also
            # when it equals today's default (a restart or rescale may change the default).
            raise SqlError(
                f"{table.where} is a changelog with 'scan.parallelism' = '{parallelism}': its changes must be "
                "routed by primary key to stay in order at a parallelism of their own; declare PRIMARY KEY (…) "
                "NOT ENFORCED on the table, or remove 'scan.parallelism'"
            )
        stream = pipeline.source(source, parallelism=parallelism, name=name)
        if table.options["connector"] == "datagen":  # generated values as the declared types
            casts = [f"CAST({quoted(c.name)} AS {c.type}) AS {quoted(c.name)}" for c in table.columns]
            stream = stream.select(*casts, name=f"{name} types", parallelism=parallelism)
        catalog.read[name] = stream.node_id
    return Stream(pipeline, catalog.read[name]), table.column_names


def _unqualify(query: exp.Select, names: set[str]) -> None:
    """``t.col`` -> ``col`` (one table is read)."""
    for column in list(query.find_all(exp.Column)):
        if column.table:
            if column.table not in names:
                raise SqlError(f"column {column.sql(dialect=DIALECT)} at {position(column)} names table "
                               f"{column.table!r}, which the query does not read")  # fmt: skip
            column.set("table", None)


def _expand_star(expressions: list[exp.Expression], columns: list[str] | None) -> list[exp.Expression]:
    expanded: list[exp.Expression] = []
    for expression in expressions:
        if isinstance(expression, exp.Star) or (isinstance(expression, exp.Column) and expression.is_star):
            if columns is None:
                raise SqlError("SELECT * over a view registered from Python: name its columns")
            expanded.extend(exp.column(name, quoted=True) for name in columns)
        else:
            expanded.append(expression)
    return expanded


def _output_names(expressions: list[exp.Expression]) -> list[str]:
    """An alias, else the column's name, else Flink's ``EXPR$i``."""
    names = []
    for index, expression in enumerate(expressions):
        if isinstance(expression, exp.Alias):
            names.append(expression.alias)
        elif isinstance(expression, exp.Column):
            names.append(expression.name)
        else:
            names.append(f"EXPR${index}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SqlError(f"the query selects column name(s) {twice} twice; alias them apart with AS")
    return names


def _aggregate(
    pipeline: Pipeline, stream: Stream, query: exp.Select, expressions: list[exp.Expression], into: str
) -> tuple[Stream, list[str]]:
    """GROUP BY: a keyed aggregate of every aggregate call, then the select list over its result."""
    group = query.args.get("group")
    keys: list[str] = []
    for key in group.expressions if group is not None else []:
        if not isinstance(key, exp.Column):
            raise SqlError(f"GROUP BY {key.sql(dialect=DIALECT)} at {position(key)}: group by columns only "
                           "(compute the expression in a view or the table first)")  # fmt: skip
        keys.append(key.name)
    if not keys:
        raise SqlError(f"an aggregate without GROUP BY at {position(query)} is not supported; GROUP BY a column")
    calls: dict[str, str] = {}
    having = query.args.get("having")
    rewritten = [_replace_aggregates(e.copy(), calls) for e in expressions]
    condition = _replace_aggregates(having.this.copy(), calls) if having is not None else None
    for expression in [*rewritten, *([condition] if condition is not None else [])]:
        for column in expression.find_all(exp.Column):
            if column.name not in keys and column.name not in calls:
                raise SqlError(f"column {column.name!r} at {position(column)} is neither in GROUP BY nor inside an "
                               "aggregate function; add it to GROUP BY or aggregate it")  # fmt: skip
    names = _output_names(expressions)
    node_id = pipeline.add(
        nodes.AggregateNode,
        (stream.node_id,),
        f"aggregate ({into})",
        None,
        keys=tuple(keys),
        aggregations=dict(calls),
        changelog=_unbounded(pipeline, stream.node_id),  # SQL: a streaming GROUP BY emits a changelog (Flink)
        changelog_input=stream.is_changelog,
    )
    result = Stream(pipeline, node_id)
    if condition is not None:
        result = result.filter(condition.sql(dialect=DIALECT), name=f"having ({into})")
    projected = [f"{e.unalias().sql(dialect=DIALECT)} AS {quoted(n)}" for e, n in zip(rewritten, names, strict=True)]
    if result.is_changelog:
        projected.append(OP)
    return result.select(*projected, name=f"select ({into})"), names


def _replace_aggregates(expression: exp.Expression, calls: dict[str, str]) -> exp.Expression:
    """Each aggregate call becomes a column ``__agg<i>`` of the aggregate's output; ``calls``
    collects them (one per distinct call)."""

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Filter):
            raise SqlError(f"FILTER (WHERE …) at {position(node)} is not supported; filter rows with WHERE")
        if not isinstance(node, exp.AggFunc):
            return node
        if type(node) not in AGGREGATES:
            raise SqlError(f"aggregate {node.sql(dialect=DIALECT)} at {position(node)} is not supported; keyflow SQL "
                           "aggregates with COUNT, COUNT(DISTINCT …), SUM, AVG, MIN and MAX")  # fmt: skip
        text = node.sql(dialect=DIALECT)
        existing = {call: name for name, call in calls.items()}
        name = existing.get(text) or f"__agg{len(calls)}"
        calls[name] = text
        return exp.column(name)

    return expression.transform(replace)


def _upserts_without_row_kinds(pipeline: Pipeline, node_id: int) -> bool:
    """Whether ``node_id`` is (after stateless operators) an insert-only streaming aggregate."""
    node = pipeline.operators[node_id]
    while isinstance(node, (nodes.SelectNode, nodes.FilterNode, nodes.WithColumnsNode)):
        node = pipeline.operators[node.inputs[0]]
    return isinstance(node, nodes.AggregateNode) and not node.changelog and _unbounded(pipeline, node.id)


def _unbounded(pipeline: Pipeline, node_id: int) -> bool:
    needed = nodes.upstream(pipeline.operators, [node_id])
    return any(getattr(n.source, "unbounded", False) for n in needed if isinstance(n, nodes.SourceNode))
