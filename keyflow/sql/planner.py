"""A SQL script onto a :class:`~keyflow.plan.builder.PlanBuilder`, statement by statement:
``SET`` sets an option, ``CREATE TABLE``/``CREATE VIEW`` declare, ``INSERT INTO`` plans its
query (:mod:`keyflow.sql.queries`) and a sink, its select list cast to the sink's types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keyflow.config import MAX_PARALLELISM
from keyflow.errors import PlanError
from keyflow.plan.builder import PlanBuilder
from keyflow.plan.functions import imported, scalar_function
from keyflow.sql.catalog import Catalog, catalog_of
from keyflow.sql.errors import SqlError
from keyflow.sql.options import check_options, parallelism_option
from keyflow.sql.queries import QueryPlanner, row_kind
from keyflow.sql.statements import CreateFunction, CreateTable, CreateView, Insert, Query, SetOption, parse_script
from keyflow.sql.tables import quoted, sink_of


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
        elif isinstance(statement, CreateFunction):
            try:
                function = imported(statement.path, statement.where)
                builder.register_function(scalar_function(statement.name, function))
            except PlanError as error:
                raise SqlError(str(error)) from None
        elif isinstance(statement, CreateView):
            if statement.name in catalog:
                raise SqlError(f"{statement.where} is declared twice; give the second another name")
            catalog.queries[statement.name] = statement
        elif isinstance(statement, Insert):
            sink_id = _insert(builder, catalog, statement)
            if statement.explain:
                planned.explained.append(builder.compile((sink_id,)).graph.render())
            else:
                planned.inserts += 1
        elif isinstance(statement, Query):
            planned.query = QueryPlanner(builder, catalog).plan(statement.query, "query")[0]
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
    node_id, names = QueryPlanner(builder, catalog).plan(statement.query, table.name)
    if len(names) != len(table.columns):
        raise SqlError(
            f"INSERT INTO {table.name} ({statement.where}) selects {len(names)} column(s) {names}; the table has "
            f"{len(table.columns)}: {table.column_names}; select them in that order"
        )
    casts = [f"CAST({quoted(n)} AS {c.type}) AS {quoted(c.name)}" for n, c in zip(names, table.columns, strict=True)]
    node_id = builder.select(node_id, [*casts, *row_kind(builder, node_id)], name=f"to {table.name}")
    parallelism = parallelism_option(table, "sink.parallelism", builder.config.get(MAX_PARALLELISM))
    name = f"sink: {table.name}"
    return builder.sink(node_id, sink, parallelism, name, primary_key=table.primary_key, run=not statement.explain)
