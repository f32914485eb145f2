"""SQL statements onto a :class:`~keyflow.plan.builder.PlanBuilder`: the builder the Python
API adds its nodes through, so a query gets the same nodes and the same checks.

``FROM`` reads a table's source (once per pipeline, whatever number of queries read it),
``WHERE`` is a filter, ``GROUP BY`` a keyed aggregate (a retracting one, emitting a
changelog, when the input is unbounded), the select list a projection cast to the sink's
column types. Expressions are transpiled to Spark SQL by sqlglot and run as Spark expressions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from keyflow.changelog import OP
from keyflow.config import MAX_PARALLELISM
from keyflow.connectors.base import changelog_mode
from keyflow.plan import nodes
from keyflow.plan.builder import PlanBuilder
from keyflow.sql.catalog import Catalog, catalog_of
from keyflow.sql.options import check_options, parallelism_option
from keyflow.sql.statements import DIALECT, CreateTable, Insert, Query, SetOption, SqlError, parse_script, position
from keyflow.sql.tables import quoted, sink_of, source_of

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
class Planned:
    """What a script did: the rendered plans of its EXPLAINs, the node id of a final bare
    SELECT (its stream), how many INSERTs it added."""

    explained: list[str] = field(default_factory=list)
    query: int | None = None
    inserts: int = 0


def plan_script(builder: PlanBuilder, text: str) -> Planned:
    """Parse ``text`` and add what it says to ``builder``'s plan."""
    catalog = catalog_of(builder)
    planned = Planned()
    for statement in parse_script(text):
        if isinstance(statement, SetOption):
            builder.set_option(statement.key, statement.value)
        elif isinstance(statement, CreateTable):
            if statement.name in catalog:
                raise SqlError(f"{statement.where} is declared twice; give the second another name")
            check_options(statement)
            catalog.tables[statement.name] = statement
        elif isinstance(statement, Insert):
            sink_id = _insert(builder, catalog, statement)
            if statement.explain:
                planned.explained.append(builder.compile((sink_id,)).graph.render())
            else:
                planned.inserts += 1
        elif isinstance(statement, Query):
            planned.query = _select(builder, catalog, statement.query, "query")[0]
    return planned


def _insert(builder: PlanBuilder, catalog: Catalog, statement: Insert) -> int:
    table = catalog.tables.get(statement.target)
    if table is None:
        raise SqlError(f"INSERT INTO {statement.target} ({statement.where}): no table {statement.target!r}; "
                       f"declare it with CREATE TABLE {statement.target} (…) WITH (…) first")  # fmt: skip
    if not statement.explain:
        if table.name in catalog.written:
            raise SqlError(f"{table.where} is written by two INSERT statements; write each sink table once")
        catalog.written.add(table.name)
    sink = sink_of(table)
    node_id, names = _select(builder, catalog, statement.query, table.name)
    if len(names) != len(table.columns):
        raise SqlError(
            f"INSERT INTO {table.name} ({statement.where}) selects {len(names)} column(s) {names}; the table has "
            f"{len(table.columns)}: {table.column_names}; select them in that order"
        )
    casts = [f"CAST({quoted(n)} AS {c.type}) AS {quoted(c.name)}" for n, c in zip(names, table.columns, strict=True)]
    node_id = builder.select(node_id, [*casts, *_row_kind(builder, node_id)], name=f"to {table.name}")
    parallelism = parallelism_option(table, "sink.parallelism", builder.config.get(MAX_PARALLELISM))
    name = f"sink: {table.name}"
    return builder.sink(node_id, sink, parallelism, name, primary_key=table.primary_key, run=not statement.explain)


def _select(builder: PlanBuilder, catalog: Catalog, query: exp.Select, into: str) -> tuple[int, list[str]]:
    """The node of ``query`` and the names of its columns (a changelog's ``op`` aside).
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
    node_id, columns = _read(builder, catalog, name)
    _unqualify(query, {name, table_node.alias_or_name})
    where = query.args.get("where")
    if where is not None:
        if any(isinstance(n, exp.AggFunc) for n in where.walk()):
            raise SqlError(f"an aggregate in WHERE at {position(where)}; filter aggregates with HAVING")
        node_id = builder.filter(node_id, where.this.sql(dialect=DIALECT), name=f"where ({into})")
    expressions = _expand_star(query.expressions, columns)
    grouped = query.args.get("group")
    if grouped is not None or any(isinstance(n, exp.AggFunc) for e in expressions for n in e.walk()):
        return _aggregate(builder, node_id, query, expressions, into)
    if query.args.get("having") is not None:
        raise SqlError(f"HAVING at {position(query.args['having'])} needs GROUP BY or an aggregate")
    names = _output_names(expressions)
    return _project(builder, node_id, expressions, names, into), names


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


def _read(builder: PlanBuilder, catalog: Catalog, name: str) -> tuple[int, list[str] | None]:
    """The node of table or view ``name`` (its source is added once) and its columns if known."""
    if name in catalog.views:
        view = catalog.views[name]
        if _upserts_without_row_kinds(builder, view):
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
        parallelism = parallelism_option(table, "scan.parallelism", builder.config.get(MAX_PARALLELISM))
        mode = changelog_mode(source)
        if mode != "insert" and not table.primary_key and parallelism is not None:
            # As Flink: a configured source parallelism routes a changelog by its primary key, also
            # when it equals today's default (a restart or rescale may change the default).
            raise SqlError(
                f"{table.where} is a changelog with 'scan.parallelism' = '{parallelism}': its changes must be "
                "routed by primary key to stay in order at a parallelism of their own; declare PRIMARY KEY (…) "
                "NOT ENFORCED on the table, or remove 'scan.parallelism'"
            )
        node_id = builder.source(source, parallelism=parallelism, name=name)
        if table.options["connector"] == "datagen":  # generated values as the declared types
            casts = [f"CAST({quoted(c.name)} AS {c.type}) AS {quoted(c.name)}" for c in table.columns]
            node_id = builder.select(node_id, casts, name=f"{name} types", parallelism=parallelism)
        catalog.read[name] = node_id
    return catalog.read[name], table.column_names


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
    builder: PlanBuilder, node_id: int, query: exp.Select, expressions: list[exp.Expression], into: str
) -> tuple[int, list[str]]:
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
    node_id = builder.aggregate(
        node_id,
        builder.key_by(keys),
        calls,
        name=f"aggregate ({into})",
        emit_changelog=builder.reads_unbounded([node_id]),  # a streaming GROUP BY emits a changelog (Flink)
    )
    if condition is not None:
        node_id = builder.filter(node_id, condition.sql(dialect=DIALECT), name=f"having ({into})")
    return _project(builder, node_id, rewritten, names, into), names


def _project(builder: PlanBuilder, node_id: int, expressions: list[exp.Expression], names: list[str], into: str) -> int:
    """The select list, named ``names``; a changelog keeps its row kinds."""
    projected = [f"{e.unalias().sql(dialect=DIALECT)} AS {quoted(n)}" for e, n in zip(expressions, names, strict=True)]
    return builder.select(node_id, [*projected, *_row_kind(builder, node_id)], name=f"select ({into})")


def _row_kind(builder: PlanBuilder, node_id: int) -> list[str]:
    """``op``, where the rows of ``node_id`` carry row kinds."""
    return [OP] if builder.is_changelog(node_id) else []


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


def _upserts_without_row_kinds(builder: PlanBuilder, node_id: int) -> bool:
    """Whether ``node_id`` is (after stateless operators) an insert-only streaming aggregate."""
    node = builder.node(node_id)
    while isinstance(node, (nodes.SelectNode, nodes.FilterNode, nodes.WithColumnsNode)):
        node = builder.node(node.inputs[0])
    return isinstance(node, nodes.AggregateNode) and not node.changelog and builder.reads_unbounded([node.id])
