"""One ``SELECT`` onto a :class:`~keyflow.plan.builder.PlanBuilder`: the builder the Python API
adds its nodes through, so a query gets the same nodes and the same checks.

``FROM`` reads a table's source (once per pipeline, whatever number of queries read it), a
view, a derived table (a subquery) or a window table function; ``WHERE`` is a filter;
``GROUP BY`` a keyed aggregate (a retracting one, emitting a changelog, when the input is
unbounded) or, over ``TUMBLE``/``HOP``/``SESSION``, an event-time window aggregate; the
select list a projection. Expressions run as Spark SQL with Flink's meanings
(:mod:`keyflow.sql.functions`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from sqlglot import exp

from keyflow.changelog import OP
from keyflow.config import MAX_PARALLELISM
from keyflow.connectors.base import changelog_mode
from keyflow.errors import PlanError
from keyflow.plan import nodes
from keyflow.plan.builder import PlanBuilder
from keyflow.plan.columns import event_time_at
from keyflow.plan.event_time import WatermarkStrategy, WindowAssigner, cumulative, session, sliding, tumbling
from keyflow.sql.catalog import Catalog
from keyflow.sql.dialect import GROUP_WINDOWS, WINDOW_FUNCTIONS, WindowTableFunction
from keyflow.sql.errors import SqlError, position
from keyflow.sql.functions import spark_sql
from keyflow.sql.intervals import interval_bounds, is_time_equality
from keyflow.sql.options import parallelism_option
from keyflow.sql.over import Over, inline_named_windows, over_aggregates, read_over
from keyflow.sql.scope import Relation, Side, belongs, expand_star, own_nodes, resolve, resolve_trees
from keyflow.sql.statements import DIALECT, CreateView, interval_micros, is_proctime
from keyflow.sql.tables import quoted, source_of
from keyflow.sql.top_n import TopN, top_n_of
from keyflow.sql.types import (
    Types,
    integer_type,
    node_types,
    over_argument_refusal,
    table_types,
    typed_meanings,
)

AGGREGATES = {exp.Count: "COUNT", exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX"}
_UNSUPPORTED = {
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
    "laterals": "LATERAL VIEW",
}
_HINTS = {
    "order": "; a stream has no order (sort the output where you read it)",
}
_WINDOW_COLUMNS = (nodes.WINDOW_START, nodes.WINDOW_END)


class QueryPlanner:
    """Plans ``SELECT``s of one script onto ``builder``; tables and views come from ``catalog``."""

    def __init__(self, builder: PlanBuilder, catalog: Catalog) -> None:
        self.builder, self.catalog = builder, catalog
        self._joins = 0
        self._named: Counter[str] = Counter()  # keyed operators' names given so far
        self._planning: set[str] = set()  # views being planned: one that reads itself is an error
        self._ctes: dict[str, tuple[int, str]] = {}  # WITH query -> (the scope it is visible in, its operators' name)
        self._scope = 0  # WITH queries of scopes below this one are hidden (a view's body sees none)

    def _keyed_name(self, kind: str, into: str) -> str:
        """A keyed operator's name, ``kind (into)``; from the second of a kind in a statement
        ``kind 2 (into)``, so that two alike (q5's two window counts) keep their state apart."""
        name = f"{kind} ({into})"
        self._named[name] += 1
        return name if self._named[name] == 1 else f"{kind} {self._named[name]} ({into})"

    def plan(self, query: exp.Select, into: str) -> tuple[int, list[str]]:
        """A statement's query: :meth:`select`, whose rows must be whole (not windowed rows
        waiting for the window join or aggregation that reads them)."""
        node_id, names = self.select(query, into)
        function = self.catalog.windowed.get(node_id)
        if function is not None:
            raise SqlError(
                f"{function.kind}(…) at {position(function)} is read without GROUP BY window_start, window_end or a "
                "window join; keyflow runs window table functions as window aggregations (GROUP BY window_start, "
                "window_end[, …]) and window joins (JOIN … ON L.window_start = R.window_start AND L.window_end = "
                "R.window_end)"
            )
        return node_id, names

    def select(self, query: exp.Select, into: str, top_n: TopN | None = None) -> tuple[int, list[str]]:
        """The node of ``query`` and the names of its columns (a changelog's ``op`` aside).
        Its operators are named after ``into`` (the sink table), so their ids stay stable.
        ``top_n``: the outer query keeps the first rows by this query's ``ROW_NUMBER()``."""
        ctes = query.args.get("with_")
        if ctes is not None:
            query.set("with_", None)
            return self._with(ctes, query, into, top_n)
        inline_named_windows(query)
        for arg, construct in _UNSUPPORTED.items():
            if query.args.get(arg):
                raise SqlError(f"{construct} at {position(query.args[arg])} is not supported in keyflow SQL"
                               f"{_HINTS.get(arg, '')}")  # fmt: skip
        source = query.args.get("from_")
        if source is None:
            raise SqlError(f"SELECT at {position(query)} reads no table; add FROM table")
        relation = self.relation(source.this, into, query)
        for join in query.args.get("joins") or []:
            relation = self._joined(relation, join, query, into)
        if relation.window is not None:
            time = relation.window.args["time"].name.lower()
            _window_time(query, relation, by_processing_time=time in self._proctime_columns(relation.node))
        over = over_aggregates(query.expressions)
        _refuse_in_expressions(query, [*([top_n.window] if top_n else []), *over])
        written = expand_star([e.copy() for e in query.expressions], relation)
        resolve(query, relation)
        types = node_types(self.builder, relation.node, self.catalog.types)
        for tree in own_nodes(query):  # Flink's integer division where both sides are known integers
            tree.replace(typed_meanings(tree.copy(), types))
        _group_window(query, relation, self.builder)
        _refuse_group_windows(query)
        names = _output_names(written)
        node_id = relation.node
        where = query.args.get("where")
        if where is not None and relation.window is not None:
            windowed = [c for c in where.find_all(exp.Column) if c.name.lower() in (*_WINDOW_COLUMNS, "window_time")]
            if windowed:
                raise SqlError(f"WHERE on {windowed[0].name} at {position(windowed[0])}: the windows are made after "
                               "WHERE; filter them in an outer query (or HAVING)")  # fmt: skip
        if where is not None:
            if any(isinstance(n, exp.AggFunc) for n in where.walk()):
                raise SqlError(f"an aggregate in WHERE at {position(where)}; filter aggregates with HAVING")
            node_id = self.builder.filter(node_id, spark_sql(where.this), name=f"where ({into})")
        expressions = expand_star(query.expressions, relation)
        grouped = query.args.get("group")
        if over:
            if top_n or grouped is not None or relation.window is not None or query.args.get("distinct") or any(
                isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window) for e in expressions
                for n in e.walk()
            ):  # fmt: skip
                raise SqlError(f"OVER at {position(over[0])} in a query with GROUP BY, other aggregates, "
                               "windows, DISTINCT or a row number is not supported; aggregate OVER in a query of "
                               "its own")  # fmt: skip
            return self._over(node_id, *read_over(expressions, types), names, into)
        aggregated = any(isinstance(n, exp.AggFunc) for e in expressions for n in e.walk())
        if top_n is not None:
            if grouped is not None or aggregated or query.args.get("distinct"):
                raise SqlError(
                    f"ROW_NUMBER() OVER at {position(top_n.window)} in a query with GROUP BY, aggregates or DISTINCT "
                    "is not supported yet; rank the grouped rows in an outer query"
                )
            if relation.window is not None:
                return self._window_top_n(node_id, relation.window, top_n, expressions, names, into)
            return self._top_n(node_id, top_n, expressions, names, into)
        if query.args.get("distinct") and (grouped is not None or aggregated or relation.window is not None):
            raise SqlError(f"SELECT DISTINCT with GROUP BY, aggregates or windows at {position(query)} is not "
                           "supported yet; select from the grouped query in a derived table with DISTINCT")  # fmt: skip
        if relation.window is not None and grouped is None and not aggregated:
            return self._windowed_rows(node_id, relation.window, expressions, names, into), names
        if relation.window is not None:
            return self._window_aggregate(node_id, relation.window, query, expressions, names, into)
        if query.args.get("distinct") and not grouped and not aggregated:
            grouped = exp.Group(expressions=[e.unalias().copy() for e in expressions])
            query.set("group", grouped)
        if grouped is not None or aggregated:
            return self._aggregate(node_id, query, expressions, names, into)
        if query.args.get("having") is not None:
            raise SqlError(f"HAVING at {position(query.args['having'])} needs GROUP BY or an aggregate")
        return self._project(node_id, expressions, names, into), names

    def _with(self, ctes: exp.With, query: exp.Select, into: str, top_n: TopN | None) -> tuple[int, list[str]]:
        """``WITH a AS (…), b AS (…) SELECT …``: each WITH query a view of this statement only
        (planned where first read, once however often read), gone once the query is planned."""
        if ctes.args.get("recursive"):
            raise SqlError(f"WITH RECURSIVE at {position(ctes)} is not supported (nor is it in Flink)")
        catalog, declared = self.catalog, []
        names = [cte.alias for cte in ctes.expressions]
        try:
            for index, cte in enumerate(ctes.expressions):
                name = cte.alias
                if name in catalog or name in declared:
                    raise SqlError(f"WITH {name} at {position(cte)}: a table, view or WITH query is named {name!r} "
                                   "already; give the WITH query another name")  # fmt: skip
                if not isinstance(cte.this, exp.Select):
                    raise SqlError(f"WITH {name} at {position(cte)} is a {type(cte.this).__name__.upper()}; keyflow "
                                   "supports WITH name AS (SELECT …)")  # fmt: skip
                if cte.args["alias"].columns:
                    raise SqlError(f"WITH {name} (…) at {position(cte)}: a column list is not supported; name the "
                                   "columns in its SELECT (… AS name)")  # fmt: skip
                later = [t.name for t in cte.this.find_all(exp.Table) if t.name in names[index + 1 :]]
                if later:
                    raise SqlError(f"WITH {name} at {position(cte)} reads {later[0]!r}, a WITH query declared after "
                                   "it; declare it first (as in Flink)")  # fmt: skip
                catalog.queries[name] = CreateView(name, cte.this, f"WITH query {name!r}")
                self._ctes[name] = (self._scope, f"{into}/{name}")
                declared.append(name)
            return self.select(query, into, top_n)
        finally:
            for name in declared:
                self._ctes.pop(name, None)
                for entries in (catalog.queries, catalog.read, catalog.columns):
                    entries.pop(name, None)

    # -- FROM ------------------------------------------------------------------------------
    def relation(self, item: exp.Expr, into: str, query: exp.Select) -> Relation:
        """What ``item``, a FROM or JOIN operand of ``query``, reads."""
        alias = item.alias if isinstance(item, (exp.Table, exp.Subquery)) else ""
        item = self._ranked_view(item)
        ranked = top_n_of(item, query)
        if ranked is not None:  # a Top-N, whose filter is in the reading query
            node_id, names = self.select(item.this, into, ranked)
            return Relation.of(node_id, names, {alias})
        if isinstance(item, exp.Table) and item.args.get("version") is not None:
            raise SqlError(f"FOR SYSTEM_TIME AS OF at {position(item)} is for the table a JOIN looks up (a temporal "
                           "join): FROM stream s JOIN table FOR SYSTEM_TIME AS OF s.proc_time AS t ON …")  # fmt: skip
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
            node_id, names = self.select(item.this, into)
            relation = Relation.of(node_id, names, {alias})
            relation.window = self.catalog.windowed.get(node_id)
            return relation
        if isinstance(item, exp.Table) and isinstance(item.this, exp.Anonymous) and item.this.name.upper() == "TABLE":
            function = item.this.expressions[0] if item.this.expressions else None
            if not isinstance(function, WindowTableFunction):
                raise SqlError(f"table function {item.this.sql(dialect=DIALECT)} at {position(item)} is not supported; "
                               "keyflow has the window table functions TUMBLE, HOP and SESSION")  # fmt: skip
            return self._windowed(function, alias, into)
        if isinstance(item, exp.Table) and item.name and not item.args.get("db"):
            node_id, columns = self.read(item.name)
            relation = Relation.of(node_id, columns, {item.name, alias})
            relation.window = self.catalog.windowed.get(node_id)
            return relation
        raise SqlError(f"FROM {item.sql(dialect=DIALECT)} at {position(item)} is not supported; read a table, a view "
                       "or (SELECT …)")  # fmt: skip

    def _ranked_view(self, item: exp.Expr) -> exp.Expr:
        """A view or WITH query numbering its rows (``ROW_NUMBER() OVER … AS rn``) as the derived
        table it stands for: the reading query's filter on ``rn`` makes it a Top-N of this reader."""
        if not isinstance(item, exp.Table) or item.args.get("db") or not self._readable_query(item.name):
            return item
        view = self.catalog.queries[item.name].query
        if not any(isinstance(e.unalias(), exp.Window) and isinstance(e.unalias().this, exp.RowNumber)
                   for e in view.expressions):  # fmt: skip
            return item
        return exp.Subquery(this=view.copy(), alias=exp.TableAlias(this=exp.to_identifier(item.alias or item.name)))

    def _readable_query(self, name: str) -> bool:
        """Whether ``name`` is a view, or a WITH query visible here (a view's body sees none of
        the WITH queries of the statement reading the view)."""
        return name in self.catalog.queries and self._ctes.get(name, (self._scope, ""))[0] >= self._scope

    def read(self, name: str) -> tuple[int, list[str] | None]:
        """The node of table or view ``name`` (its source is added once) and its columns if known."""
        catalog, builder = self.catalog, self.builder
        if name in catalog.views:
            view = catalog.views[name]
            if _upserts_without_row_kinds(builder, view):
                raise SqlError(
                    f"view {name!r} is a streaming aggregate of the Python API: it emits each changed key's new "
                    "value without row kinds, so SQL cannot retract the old one; aggregate in SQL (GROUP BY) "
                    "instead, or register the stream before the aggregate"
                )
            return view, None
        if self._readable_query(name):
            if name not in catalog.read:
                what = "WITH query" if name in self._ctes else "view"
                if name in self._planning:
                    raise SqlError(f"{what} {name!r} reads itself (through {sorted(self._planning)}); it reads "
                                   "tables and views declared before it")  # fmt: skip
                self._planning.add(name)
                scope = self._scope
                if name not in self._ctes:
                    self._scope += 1  # a view's body sees no WITH query of the statement reading it
                try:
                    into = self._ctes[name][1] if name in self._ctes else name
                    catalog.read[name], catalog.columns[name] = self.select(catalog.queries[name].query.copy(), into)
                finally:
                    self._scope = scope
                    self._planning.discard(name)
            return catalog.read[name], catalog.columns[name]
        table = catalog.tables.get(name)
        if table is None:
            known = ", ".join(sorted([*catalog.tables, *catalog.views, *catalog.queries])) or "none"
            raise SqlError(f"no table or view {name!r} to read FROM (declared: {known}); declare it with CREATE "
                           "TABLE or CREATE VIEW")  # fmt: skip
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
            watermark = None
            if table.watermark is not None:
                delay = f"{table.watermark.delay} us"
                watermark = WatermarkStrategy.for_bounded_out_of_orderness(table.watermark.column, delay)
            node_id = builder.source(source, parallelism=parallelism, name=name, watermark=watermark)
            if table.options["connector"] == "datagen":  # generated values as the declared types
                event_time = table.watermark.column if table.watermark else None  # a timestamp already; kept as is
                casts = [quoted(c.name) if c.name == event_time else f"CAST({quoted(c.name)} AS {c.type}) AS "
                         f"{quoted(c.name)}" for c in table.columns]  # fmt: skip
                casts += [quoted(name) for name, _ in table.computed]
                node_id = builder.select(node_id, casts, name=f"{name} types", parallelism=parallelism)
            if table.proctime:
                catalog.proctime[node_id] = {column.lower() for column in table.proctime}
            catalog.types[node_id] = table_types(table)
            catalog.read[name], catalog.columns[name] = node_id, table.readable_names
        return catalog.read[name], catalog.columns[name]

    def _joined(self, left: Relation, join: exp.Join, query: exp.Select, into: str) -> Relation:
        """A regular join (inner or outer) of ``left`` and the table ``join`` reads, on the
        equalities of its condition between a column of each; for an inner join the rest of
        the condition filters the joined rows."""
        version = join.this.args.get("version") if isinstance(join.this, exp.Table) else None
        right = self.relation(join.this if version is None else _unversioned(join.this), into, query)
        if (left.window is None) != (right.window is None):
            raise SqlError(f"JOIN at {position(join)} of a window table function and a table: join two window table "
                           "functions of the same windows (a window join), or aggregate the windows in a subquery "
                           "(GROUP BY window_start, window_end, …) first")  # fmt: skip
        how = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}.get(join.side.upper())
        if how is None or join.args.get("using") or join.kind.upper() in ("SEMI", "ANTI"):
            raise SqlError(f"{join.side} {join.kind} JOIN at {position(join)} is not supported; keyflow joins with "
                           "[INNER | LEFT | RIGHT | FULL [OUTER]] JOIN … ON")  # fmt: skip
        if version is not None:
            self._check_temporal(join.this, left, right, how)
        condition = join.args.get("on")
        comma = condition is None
        if comma:  # FROM a, b WHERE a.x = b.y: the WHERE's equalities join them (and still filter)
            where = query.args.get("where")
            condition = where.this.copy() if where is not None else None
        time_side = self._event_time_side((left, left.node), (right, right.node))
        timed = version is None and left.window is None  # whether time conditions may bound the join
        pairs, rest = _equalities(condition, left, right, lambda c: timed and is_time_equality(c, time_side))
        between, bounded = interval_bounds(rest, time_side) if timed else (None, rest)
        if between is None or not pairs:  # no interval join (it needs a key): equal times are a key, as before
            pairs, rest = _equalities(condition, left, right, lambda c: False)
            between = None
        else:
            rest = bounded
        windows = None
        if left.window is not None and right.window is not None:
            windows, pairs = _window_join_windows(join, left.window, right.window, pairs)
            left, right = _without_windows(left), _without_windows(right)
        updating = [side for side, r in (("left", left), ("right", right)) if self.builder.is_changelog(r.node)]
        if updating and (windows is not None or between is not None):
            raise SqlError(
                f"JOIN at {position(join)}: its {updating[0]} table is updated or retracted (a streaming GROUP BY, "
                "Top-N or outer join, or a changelog table); a time-bounded (interval or window) join takes tables "
                "of inserts, as in Flink: join the rows before they are aggregated or ranked, or drop the time bound"
            )
        if not pairs:
            besides = " besides the windows" if windows is not None else ""
            raise SqlError(f"JOIN at {position(join)} needs an equality between a column of each table{besides}, e.g. "
                           "ON a.id = b.id (keyflow runs keyed joins; a cross join is not supported)")  # fmt: skip
        self._joins += 1
        keys = [(f"__join{self._joins}_left{i}", f"__join{self._joins}_right{i}") for i in range(len(pairs))]
        left_node = self._with_keys(left, [(k, e) for (k, _), (e, _) in zip(keys, pairs, strict=True)])
        right, right_node = self._renamed(right, left, [(k, e) for (_, k), (_, e) in zip(keys, pairs, strict=True)])
        if between is not None and between[0] > between[1]:
            raise SqlError(f"JOIN at {position(join)}: its time condition keeps no pair (right time - left time from "
                           f"{between[0]} to {between[1]} us); swap the bounds")  # fmt: skip
        if rest and how != "inner" and not comma:
            shown = " AND ".join(r.sql(dialect=DIALECT) for r in rest)
            raise SqlError(
                f"{how.upper()} JOIN at {position(join)}: the condition {shown} is not an equality of the two "
                "tables nor a bound of one's event time by the other's; an outer join takes those only (filter in "
                "a subquery first)"
            )
        if version is not None:  # Flink's lookup join: the table read whole, its rows never in state
            label = f"lookup join {self._joins} ({into})"
            try:
                node_id = self.builder.lookup_join((left_node, right_node), keys, how, label)
            except PlanError:
                raise SqlError(
                    f"JOIN {join.this.name} FOR SYSTEM_TIME AS OF at {position(version)}: {join.this.name!r} is not a "
                    "table to look up: a lookup join reads it whole at every micro-batch, so it must be bounded "
                    "(files) and read by no aggregate or join; join two streams with a plain JOIN"
                ) from None
        elif windows is not None:  # Flink's window join: a window's rows leave the state when it ends
            label = f"window join {self._joins} ({into})"
            node_id = self.builder.window_join((left_node, right_node), keys, windows, how, label, None)
        elif between is not None:  # Flink's interval join: the watermark clears the rows that can match no more
            label = f"interval join {self._joins} ({into})"
            node_id = self.builder.interval_join((left_node, right_node), keys, between, how, label, None)
        else:
            label = f"join {self._joins} ({into})"
            node_id = self.builder.join((left_node, right_node), keys, how, name=label, parallelism=None)
        joined = Relation(node_id, [*left.sides, *right.sides], order=[*left.order, *right.order])
        if windows is not None:
            joined = _with_windows(joined, len(left.sides))
        if rest and not comma:
            condition = exp.and_(*rest)
            resolve_trees([condition], joined)
            condition = typed_meanings(condition, node_types(self.builder, node_id, self.catalog.types))
            node_id = self.builder.filter(node_id, spark_sql(condition), name=f"{label} condition")
            joined.node = node_id
        return joined

    def _check_temporal(self, table: exp.Table, left: Relation, right: Relation, how: str) -> None:
        """A temporal join keyflow runs: AS OF the left table's PROCTIME() column (Flink's lookup
        join against a table read whole), INNER or LEFT."""
        version = table.args["version"]
        moment = version.expression
        kind = str(version.args.get("kind")).upper()
        if version.name.upper() != "TIMESTAMP" or kind != "AS OF" or moment is None:
            written = f"FOR SYSTEM_TIME {kind}" if version.name.upper() == "TIMESTAMP" else f"FOR {version.name} {kind}"
            raise SqlError(f"{written} at {position(table)} is not supported; keyflow joins a table FOR SYSTEM_TIME "
                           "AS OF a PROCTIME() column of the stream")  # fmt: skip
        proctime = self._proctime_columns(left.node)
        resolved = moment.copy()
        if isinstance(moment, exp.Column) and belongs(moment, left) and not belongs(moment, right):
            resolve_trees([resolved], left)
            if resolved.name.lower() in proctime:
                self._check_lookup_how(version, how)
                return
        raise SqlError(
            f"FOR SYSTEM_TIME AS OF {moment.sql(dialect=DIALECT)} at {position(version)}: it is not a PROCTIME() "
            "column of the stream here (a GROUP BY, CAST or a join before makes it a plain timestamp, as in Flink); "
            "keyflow joins a table as of processing time (Flink's lookup join); a temporal join as of event time "
            "(against a versioned table) is not supported yet"
        )

    @staticmethod
    def _check_lookup_how(version: exp.Expr, how: str) -> None:
        """A lookup join keeps every row of the stream, or only matched ones (Flink's too)."""
        if how not in nodes.LOOKUP_JOIN_TYPES:
            raise SqlError(f"{how.upper()} JOIN … FOR SYSTEM_TIME AS OF at {position(version)}: a lookup join is "
                           "INNER or LEFT (the table's rows are not a stream)")  # fmt: skip

    def _proctime_columns(self, node_id: int) -> set[str]:
        """The PROCTIME() columns (lower case) of ``node_id``'s rows, through filters and added columns."""
        node = self.builder.node(node_id)
        passing = (nodes.FilterNode, nodes.WithColumnsNode, nodes.LookupJoinNode)  # the left's names stay
        while node.id not in self.catalog.proctime and isinstance(node, passing):
            node = self.builder.node(node.inputs[0])
        return self.catalog.proctime.get(node.id, set())

    def _event_time_side(
        self, left: tuple[Relation, int], right: tuple[Relation, int]
    ) -> Callable[[exp.Column], int | None]:
        """Which table's event-time column (the one its WATERMARK is declared on) a column of the
        join's condition is: LEFT, RIGHT, or None (another column, or a table without event time)."""
        times = [event_time_at(self.builder.operators, node_id) for _, node_id in (left, right)]

        def side_of(column: exp.Column) -> int | None:
            relations = [relation for relation, _ in (left, right)]
            for side, relation in enumerate(relations):
                other = relations[1 - side]
                if times[side] is None or not belongs(column, relation) or belongs(column, other):
                    continue
                resolved = column.copy()
                resolve_trees([resolved], relation)
                return side if resolved.name.lower() == str(times[side]).lower() else None
            return None

        return side_of

    def _with_keys(self, relation: Relation, keys: list[tuple[str, exp.Expr]]) -> int:
        """The relation's rows with each join key (an expression of its columns) as a column."""
        trees = [expression.copy() for _, expression in keys]
        resolve_trees(trees, relation)
        types = node_types(self.builder, relation.node, self.catalog.types)
        trees = [typed_meanings(tree, types) for tree in trees]
        columns = {name: spark_sql(tree) for (name, _), tree in zip(keys, trees, strict=True)}
        return self.builder.with_columns(relation.node, columns)

    def _renamed(self, right: Relation, left: Relation, keys: list[tuple[str, exp.Expr]]) -> tuple[Relation, int]:
        """The right side's rows with its join keys, and its columns that the left side has
        too renamed as Flink's planner does (``id`` -> ``id0``)."""
        node_id = self._with_keys(right, keys)
        if right.columns is None or left.columns is None:
            return right, node_id
        taken = {name.lower() for name in left.columns}
        renames: dict[str, str] = {}
        for name in right.columns:
            if name.lower() in taken:
                number = 0
                while f"{name}{number}".lower() in taken or f"{name}{number}" in right.columns:
                    number += 1
                renames[name] = f"{name}{number}"
                taken.add(renames[name].lower())
        time = event_time_at(self.builder.operators, node_id)
        hidden = time is not None and time.startswith("__") and time not in right.columns  # windowed rows' own
        clash = hidden and time == event_time_at(self.builder.operators, left.node)  # a windowed view with itself
        if not renames and not clash:
            return right, node_id
        keep = [f"{quoted(n)} AS {quoted(renames.get(n, n))}" for n in right.columns] + [quoted(k) for k, _ in keys]
        keep += row_kind(self.builder, node_id)
        if hidden:
            keep.append(f"{quoted(str(time))} AS {quoted(f'__join{self._joins}_time' if clash else str(time))}")
        node_id = self.builder.select(node_id, keep, name="rename")
        sides = [
            Side(side.aliases, None if side.names is None else {w: renames.get(n, n) for w, n in side.names.items()})
            for side in right.sides
        ]
        return Relation(node_id, sides, order=[(w, renames.get(n, n)) for w, n in right.order]), node_id

    def _windowed(self, function: WindowTableFunction, alias: str, into: str) -> Relation:
        """``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), …))``: ``t``'s rows, windowed by the GROUP BY."""
        table = function.args["table"]
        node_id, columns = self.read(table.name)
        time = function.args["time"].name
        event_time = event_time_at(self.builder.operators, node_id)
        proctime = time.lower() in self._proctime_columns(node_id)
        if not proctime and (event_time is None or event_time.lower() != time.lower()):
            declared = f"its event time is {event_time!r}" if event_time else "it has no WATERMARK"
            raise SqlError(
                f"{function.kind}(TABLE {table.name}, DESCRIPTOR({time}), …) at {position(function)}: keyflow windows "
                f"by the column a WATERMARK is declared on, and {declared}; declare WATERMARK FOR {time} AS {time} - "
                "INTERVAL '5' SECOND on the table"
            )
        relation = Relation.of(node_id, None if columns is None else [*columns, *_WINDOW_COLUMNS], {table.name, alias})
        relation.window = function
        return relation

    def _windowed_rows(
        self, node_id: int, function: WindowTableFunction, expressions: list[exp.Expr], names: list[str], into: str
    ) -> int:
        """``SELECT … FROM TABLE(TUMBLE(…))`` without GROUP BY: its rows, whose windows the window
        join (or the window aggregation) that reads them assigns; so the select list may pass
        ``window_start`` and ``window_end`` on but not compute with them, and the event-time
        column is kept (hidden where not selected)."""
        self._event_time_windows(node_id, function, "a window join")
        time = event_time_at(self.builder.operators, node_id)
        columns, keeps_time = [], False
        for expression, name in zip(expressions, names, strict=True):
            tree = expression.unalias()
            read = [c for c in tree.find_all(exp.Column) if c.name.lower() in (*_WINDOW_COLUMNS, "window_time")]
            if read and isinstance(tree, exp.Column) and tree.name.lower() == name.lower() in _WINDOW_COLUMNS:
                continue  # made by the operator that reads these rows
            if read:
                raise SqlError(f"{expression.sql(dialect=DIALECT)} at {position(expression)} computes with the "
                               f"windows of {function.kind}(…), which keyflow makes in the window join or aggregation "
                               "that reads these rows; compute it in that outer query")  # fmt: skip
            columns.append(f"{spark_sql(tree)} AS {quoted(name)}")
            keeps_time = keeps_time or (isinstance(tree, exp.Column) and tree.name.lower() == str(time).lower())
        if not keeps_time:  # hidden (SELECT * skips it), one name per table: two joined never clash
            columns.append(f"{quoted(str(time))} AS `__window_time{len(self.catalog.windowed)}`")
        node_id = self.builder.select(node_id, columns, name=f"select ({into})")
        self.catalog.windowed[node_id] = function
        return node_id

    # -- aggregates ------------------------------------------------------------------------
    def _aggregate(
        self, node_id: int, query: exp.Select, expressions: list[exp.Expr], names: list[str], into: str
    ) -> tuple[int, list[str]]:
        """GROUP BY: a keyed aggregate of every aggregate call, then the select list over its result."""
        node_id, keys, expressions, having = self._keys(node_id, query, expressions)
        if not keys:
            raise SqlError(f"an aggregate without GROUP BY at {position(query)} is not supported; GROUP BY a column")
        types = node_types(self.builder, node_id, self.catalog.types)
        calls, rewritten, condition = _aggregate_calls(expressions, having, keys, types)
        node_id = self.builder.aggregate(
            node_id,
            self.builder.key_by(keys),
            calls,
            name=self._keyed_name("aggregate", into),
            emit_changelog=self.builder.reads_unbounded([node_id]),  # a streaming GROUP BY emits a changelog (Flink)
        )
        if condition is not None:
            node_id = self.builder.filter(node_id, spark_sql(condition), name=f"having ({into})")
        return self._project(node_id, rewritten, names, into), names

    def _window_aggregate(
        self,
        node_id: int,
        function: WindowTableFunction,
        query: exp.Select,
        expressions: list[exp.Expr],
        names: list[str],
        into: str,
    ) -> tuple[int, list[str]]:
        """GROUP BY window_start, window_end[, keys] over a window table function: per-key
        aggregates per event-time window, emitted once when the watermark passes its end."""
        group = query.args.get("group")
        grouped = {k.name.lower() for k in (group.expressions if group else []) if isinstance(k, exp.Column)}
        if group is None or not {nodes.WINDOW_START, nodes.WINDOW_END} <= grouped:
            raise SqlError(
                f"{function.kind}(…) at {position(function)} is read without GROUP BY window_start, window_end; "
                "keyflow runs window table functions as window aggregations: GROUP BY window_start, window_end[, …]"
            )
        group.set("expressions", [k for k in group.expressions if k.name.lower() not in _WINDOW_COLUMNS])
        partition = {c.name.lower() for c in function.args.get("partition_by") or []}
        if partition and partition != {k.name.lower() for k in group.expressions}:
            raise SqlError(
                f"{function.kind}(TABLE … PARTITION BY …) at {position(function)}: keyflow keys the windows by the "
                "GROUP BY's columns besides window_start and window_end; PARTITION BY must name the same columns"
            )
        constant = not group.expressions
        if constant:  # one window for all rows (Flink runs it at parallelism 1)
            node_id = self.builder.with_columns(node_id, {"__window_all": "0"})
            group.set("expressions", [exp.column("__window_all")])
        node_id, keys, expressions, having = self._keys(node_id, query, expressions)
        types = node_types(self.builder, node_id, self.catalog.types)
        calls, rewritten, condition = _aggregate_calls(expressions, having, [*keys, *_WINDOW_COLUMNS], types)
        if not calls:
            calls["__window_rows"] = "COUNT(*)"
        keying = self.builder.key_by(keys)
        time = function.args["time"].name
        if time.lower() in self._proctime_columns(node_id):  # Flink's processing-time windows
            try:
                windowing = self.builder.processing_windowing(node_id, keying, _assigner(function), time)
            except PlanError as error:
                raise SqlError(f"{function.kind}(…) at {position(function)}: {error}") from None
        else:
            windowing = self.builder.windowing(node_id, keying, _assigner(function), 0, None)
        node_id = self.builder.window_aggregate(node_id, keying, windowing, calls)
        self.builder.rename(node_id, self._keyed_name(f"{function.kind.lower()} window", into))
        if condition is not None:
            node_id = self.builder.filter(node_id, spark_sql(condition), name=f"having ({into})")
        return self._project(node_id, rewritten, names, into), names

    def _keys(
        self, node_id: int, query: exp.Select, expressions: list[exp.Expr]
    ) -> tuple[int, list[str], list[exp.Expr], exp.Expr | None]:
        """The GROUP BY's key columns; a key that is an expression is computed first as a column
        ``__key<i>``, and the select list and HAVING read that column where they repeat it."""
        group = query.args.get("group")
        having = query.args.get("having")
        condition = having.this if having is not None else None
        keys: list[str] = []
        computed: dict[str, str] = {}
        for key in group.expressions if group is not None else []:
            if isinstance(key, exp.Column) and not key.table:
                keys.append(key.name)
                continue
            name = f"__key{len(computed)}"
            computed[name] = spark_sql(key)
            keys.append(name)
            expressions = [_replace_expression(e, key, name) for e in expressions]
            condition = _replace_expression(condition, key, name) if condition is not None else None
        if computed:
            node_id = self.builder.with_columns(node_id, computed)
        return node_id, keys, expressions, condition

    def _top_n(
        self, node_id: int, top_n: TopN, expressions: list[exp.Expr], names: list[str], into: str
    ) -> tuple[int, list[str]]:
        """The select list, then Flink's Top-N by its ``ROW_NUMBER() OVER (PARTITION BY …
        ORDER BY …)``: keyed by the partition, the first ``top_n.limit`` rows in the order;
        the row number is a column only where the outer query reads it."""
        at = next(i for i, e in enumerate(expressions) if e.find(exp.Window) is not None)
        window = expressions[at].unalias()
        listed = [(e, n) for i, (e, n) in enumerate(zip(expressions, names, strict=True)) if i != at]
        partition, ordered = window.args.get("partition_by") or [], window.args.get("order")
        if not partition or ordered is None:
            raise SqlError(
                f"ROW_NUMBER() OVER at {position(window)} needs PARTITION BY and ORDER BY: keyflow runs it as Flink's "
                "Top-N, keyed by the partition"
            )
        _no_frame(window)
        column_of, hidden = _rank_columns(listed)

        proctime = self._proctime_columns(node_id)
        for item in ordered.expressions:
            if is_proctime(item.this) or (isinstance(item.this, exp.Column) and item.this.name.lower() in proctime):
                raise SqlError(f"ROW_NUMBER() OVER (… ORDER BY {item.this.sql(dialect=DIALECT)}) at {position(item)}: "
                               "a Top-N or deduplication by processing time is not supported; order by the event "
                               "time (the WATERMARK column) or other columns")  # fmt: skip
        keys = [column_of(key, "rank_key") for key in partition]
        order = [(column_of(item.this, "rank_order"), bool(item.args.get("desc"))) for item in ordered.expressions]
        for item in ordered.expressions:
            if item.args.get("nulls_first") is not None and item.args["nulls_first"] == bool(item.args.get("desc")):
                nulls = "FIRST" if item.args["nulls_first"] else "LAST"
                raise SqlError(
                    f"NULLS {nulls} at {position(item)}: keyflow's Top-N puts nulls first ascending and last "
                    "descending (Flink's default); remove it"
                )
        columns = [f"{spark_sql(e.unalias())} AS {quoted(n)}" for e, n in listed]
        columns += [f"{spark_sql(tree)} AS {quoted(name)}" for name, tree in hidden.items()]
        node_id = self.builder.select(node_id, [*columns, *row_kind(self.builder, node_id)], name=f"select ({into})")
        try:
            node_id = self.builder.rank(node_id, self.builder.key_by(keys), order, top_n.limit,
                                        _rank_column(top_n, names, at), name=self._keyed_name("top-n", into),
                                        first=top_n.first)  # fmt: skip
        except PlanError as error:
            raise SqlError(f"ROW_NUMBER() OVER at {position(window)}: {error}") from None
        return self._numbered_columns(node_id, top_n, names, at, into)

    def _numbered_columns(
        self, node_id: int, top_n: TopN, names: list[str], at: int, into: str
    ) -> tuple[int, list[str]]:
        """The select list after a Top-N: the row number (``names[at]``) only where the reading
        query reads it, a constant for a one-row range."""
        rank_column = _rank_column(top_n, names, at)
        number = quoted(names[at]) if rank_column else f"CAST({top_n.first} AS BIGINT) AS {quoted(names[at])}"
        kept = [number if i == at else quoted(n) for i, n in enumerate(names) if i != at or top_n.numbered]
        node_id = self.builder.select(
            node_id, [*kept, *row_kind(self.builder, node_id)], name=f"top-n columns ({into})"
        )
        return node_id, [n for i, n in enumerate(names) if i != at or top_n.numbered]

    def _over(
        self, node_id: int, over: Over, expressions: list[exp.Expr], names: list[str], into: str
    ) -> tuple[int, list[str]]:
        """Flink's OVER aggregation keyed by the partition (expressions other than columns
        computed first), then the select list reading the aggregates as columns."""
        keys, computed = [], []
        for index, key in enumerate(over.partition):
            if isinstance(key, exp.Column) and not key.table:
                keys.append(key.name)
            else:
                keys.append(f"__over_key{index}")
                computed.append(f"{spark_sql(key)} AS {quoted(keys[-1])}")
        if computed:
            node_id = self.builder.select(node_id, ["*", *computed], name=f"over keys ({into})")
        refused = over_argument_refusal(over.calls, node_types(self.builder, node_id, self.catalog.types))
        if refused:
            raise SqlError(f"OVER at {position(over.window)}: {refused}")
        try:
            node_id = self.builder.over(node_id, self.builder.key_by(keys), over.order.name, over.calls, over.frame,
                                        name=self._keyed_name("over", into))  # fmt: skip
        except PlanError as error:
            raise SqlError(f"OVER at {position(over.window)}: {error}") from None
        return self._project(node_id, expressions, names, into), names

    def _window_top_n(
        self,
        node_id: int,
        function: WindowTableFunction,
        top_n: TopN,
        expressions: list[exp.Expr],
        names: list[str],
        into: str,
    ) -> tuple[int, list[str]]:
        """Flink's window Top-N (window deduplication) after a window table function: ``ROW_NUMBER()
        OVER (PARTITION BY window_start, window_end[, keys] ORDER BY …)`` filtered by the reading
        query; keyflow assigns the windows in the operator, so the select list may pass
        ``window_start``/``window_end`` on but not compute with them."""
        self._event_time_windows(node_id, function, "a window Top-N")
        at = next(i for i, e in enumerate(expressions) if e.find(exp.Window) is not None)
        window = expressions[at].unalias()
        if function.kind == "SESSION":
            raise SqlError(f"ROW_NUMBER() OVER at {position(window)} over SESSION(…) at {position(function)}: a "
                           "window Top-N of session windows is not supported; rank a session window aggregation's "
                           "rows")  # fmt: skip
        partition, ordered = window.args.get("partition_by") or [], window.args.get("order")
        by_window = {c.name.lower() for c in partition if isinstance(c, exp.Column)} & set(_WINDOW_COLUMNS)
        if by_window != set(_WINDOW_COLUMNS) or ordered is None:
            raise SqlError(
                f"ROW_NUMBER() OVER at {position(window)} over {function.kind}(…) needs PARTITION BY window_start, "
                "window_end[, keys] and ORDER BY: as Flink's window Top-N, it ranks the rows of each window"
            )
        _no_frame(window)
        time = event_time_at(self.builder.operators, node_id)
        listed, passed = [], []
        for index, (expression, name) in enumerate(zip(expressions, names, strict=True)):
            tree = expression.unalias()
            if index == at:
                continue
            if isinstance(tree, exp.Column) and tree.name.lower() == name.lower() in _WINDOW_COLUMNS:
                passed.append(name)
                continue
            if isinstance(tree, exp.Column) and tree.name.lower() in _WINDOW_COLUMNS:
                raise SqlError(f"{expression.sql(dialect=DIALECT)} at {position(expression)} renames {tree.name}, "
                               "which keyflow makes in the window Top-N; rename it in the query that reads the "
                               "ranked rows")  # fmt: skip
            if any(c.name.lower() in (*_WINDOW_COLUMNS, "window_time") for c in tree.find_all(exp.Column)):
                raise SqlError(f"{expression.sql(dialect=DIALECT)} at {position(expression)} computes with the "
                               f"windows of {function.kind}(…), which keyflow makes in the window Top-N; compute it "
                               "in the query that reads the ranked rows")  # fmt: skip
            listed.append((tree, name))
        column_of, hidden = _rank_columns(listed)

        keys = [column_of(key, "rank_key") for key in partition if not (
            isinstance(key, exp.Column) and key.name.lower() in _WINDOW_COLUMNS)]  # fmt: skip
        if any(isinstance(i.this, exp.Column) and i.this.name.lower() in _WINDOW_COLUMNS for i in ordered.expressions):
            raise SqlError(f"ORDER BY window_start or window_end at {position(ordered)}: within a window they are "
                           "the same for every row; order by the rows' columns")  # fmt: skip
        order = [(column_of(item.this, "rank_order"), bool(item.args.get("desc"))) for item in ordered.expressions]
        if not keys:  # one ranking per window (Flink runs it at parallelism 1)
            keys = [column_of(exp.Literal.number(0), "rank_key")]
        columns = [f"{spark_sql(e)} AS {quoted(n)}" for e, n in listed]
        columns += [f"{spark_sql(tree)} AS {quoted(name)}" for name, tree in hidden.items()]
        if time is not None and not any(_same_column(e, exp.column(time)) for e, _ in listed):
            columns.append(f"{quoted(time)} AS `__window_time`")  # the windows are assigned by it
        node_id = self.builder.select(node_id, columns, name=f"select ({into})")
        keying = self.builder.key_by(keys)
        windowing = self.builder.windowing(node_id, keying, _assigner(function), 0, None)
        node_id = self.builder.window_rank(node_id, keying, windowing, order, top_n.limit,
                                           _rank_column(top_n, names, at),
                                           name=self._keyed_name(f"{function.kind.lower()} window top-n", into),
                                           first=top_n.first)  # fmt: skip
        return self._numbered_columns(node_id, top_n, names, at, into)

    def _event_time_windows(self, node_id: int, function: WindowTableFunction, what: str) -> None:
        """Refuses windows by a PROCTIME() column where only a window aggregation takes them."""
        time = function.args["time"].name
        if time.lower() in self._proctime_columns(node_id):
            raise SqlError(
                f"{function.kind}(…, DESCRIPTOR({time}), …) at {position(function)}: {time} is a PROCTIME() column; "
                f"keyflow runs processing-time windows as window aggregations (GROUP BY window_start, window_end), "
                f"not in {what}, which windows by the column a WATERMARK is declared on"
            )

    def _project(self, node_id: int, expressions: list[exp.Expr], names: list[str], into: str) -> int:
        """The select list, named ``names``; a changelog keeps its row kinds, and a PROCTIME()
        column (made here, or passed on) stays one."""
        projected = [f"{spark_sql(e.unalias())} AS {quoted(n)}" for e, n in zip(expressions, names, strict=True)]
        upstream = self._proctime_columns(node_id)
        proctime = {
            name.lower() for expression, name in zip(expressions, names, strict=True)
            if is_proctime(tree := expression.unalias()) or (isinstance(tree, exp.Column) and not tree.table
                                                            and tree.name.lower() in upstream)
        }  # fmt: skip
        node_id = self.builder.select(node_id, [*projected, *row_kind(self.builder, node_id)], name=f"select ({into})")
        if proctime:
            self.catalog.proctime[node_id] = proctime
        return node_id


def _rank_column(top_n: TopN, names: list[str], at: int) -> str | None:
    """The row number's column, where the Top-N keeps one: as Flink's RankNumberColumnRemoveRule,
    a one-row range's number is a constant, not a column."""
    return names[at] if top_n.numbered and top_n.first < top_n.limit else None


def _no_frame(window: exp.Expr) -> None:
    if window.args.get("spec") is not None:
        raise SqlError(f"a frame (ROWS/RANGE BETWEEN) in ROW_NUMBER() OVER at {position(window)} has no meaning; "
                       "remove it")  # fmt: skip


def _rank_columns(
    listed: list[tuple[exp.Expr, str]],
) -> tuple[Callable[[exp.Expr, str], str], dict[str, exp.Expr]]:
    """A Top-N's keys and order as columns: one of the select list's (``listed``: expression,
    name) where it has the expression, else a hidden ``__<prefix><i>`` column, collected in
    the returned dict to be computed before the ranking."""
    hidden: dict[str, exp.Expr] = {}

    def column_of(tree: exp.Expr, prefix: str) -> str:
        for expression, name in listed:
            if _same_column(expression.unalias(), tree):
                return name
        hidden[f"__{prefix}{len(hidden)}"] = tree
        return f"__{prefix}{len(hidden) - 1}"

    return column_of, hidden


def row_kind(builder: PlanBuilder, node_id: int) -> list[str]:
    """``op``, where the rows of ``node_id`` carry row kinds."""
    return [OP] if builder.is_changelog(node_id) else []


def _window_time(query: exp.Select, relation: Relation, by_processing_time: bool) -> None:
    """Flink's ``window_time`` in a window aggregation's select list, GROUP BY and HAVING, as
    what it is: ``window_end`` less a millisecond (not a time attribute here: a later window or
    time-bounded join cannot use it). GROUP BY window_time adds no key."""
    group = query.args.get("group")
    keys = {k.name.lower() for k in (group.expressions if group else []) if isinstance(k, exp.Column)}
    if (
        group is None
        or not {nodes.WINDOW_START, nodes.WINDOW_END} <= keys
        or any(side.has("window_time") for side in relation.sides)
    ):
        return  # not a window aggregation (scope names window_time where it is read), or a column of that name
    group.set("expressions", [k for k in group.expressions if not _names_window_time(k)])
    having = query.args.get("having")
    for tree in [*query.expressions, *group.expressions, *([having] if having is not None else [])]:
        for column in [c for c in tree.find_all(exp.Column) if _names_window_time(c)]:
            if by_processing_time:
                raise SqlError(f"window_time at {position(column)} of processing-time windows is, in Flink, the time "
                               "each window is emitted at; keyflow does not give it: select window_end")  # fmt: skip
            if column.find_ancestor(exp.AggFunc, exp.Filter) is not None or column.find_ancestor(exp.Group):
                raise SqlError(f"window_time at {position(column)} inside an aggregate, a FILTER or a GROUP BY "
                               "expression is not supported; keyflow makes it from window_end after the windows are "
                               "aggregated: compute with it in the select list or an outer query")  # fmt: skip
    for tree in [*query.expressions, *([having] if having is not None else [])]:
        for column in [c for c in tree.find_all(exp.Column) if _names_window_time(c)]:
            end = exp.column(nodes.WINDOW_END, table=column.table or None)
            time = exp.Sub(this=end, expression=exp.Interval(this=exp.Literal.string("0.001"), unit=exp.var("SECOND")))
            replaced = exp.alias_(time, "window_time") if column is tree else exp.paren(time)
            if column is tree:
                query.set("expressions", [replaced if e is tree else e for e in query.expressions])
            else:
                column.replace(replaced)


def _names_window_time(tree: exp.Expr) -> bool:
    return isinstance(tree, exp.Column) and tree.name.lower() == "window_time"


def _assigner(function: WindowTableFunction) -> WindowAssigner:
    """The windows of ``TUMBLE(…, size[, offset])``, ``HOP(…, slide, size[, offset])``,
    ``CUMULATE(…, step, size[, offset])`` or ``SESSION(…, gap)``, as Flink defines them."""
    forms = {"TUMBLE": "size[, offset]", "HOP": "slide, size[, offset]", "CUMULATE": "step, size[, offset]",
             "SESSION": "gap"}  # fmt: skip
    wanted = {"TUMBLE": 1, "HOP": 2, "CUMULATE": 2, "SESSION": 1}[function.kind]
    intervals = function.expressions
    offsets = len(intervals) - wanted
    if offsets not in (0, 1) or (offsets and function.kind == "SESSION"):
        raise SqlError(
            f"{function.kind}(TABLE t, DESCRIPTOR(ts), {forms[function.kind]}) at {position(function)} takes "
            f"{wanted}{'' if function.kind == 'SESSION' else ' or ' + str(wanted + 1)} interval(s), got "
            f"{len(intervals)}"
        )
    parts = {"TUMBLE": ("size",), "HOP": ("slide", "size"), "CUMULATE": ("step", "size"), "SESSION": ("gap",)}
    micros = [interval_micros(size, f"the {function.kind} {part}") for size, part in
              zip(intervals[:wanted], parts[function.kind], strict=True)]  # fmt: skip
    shown = [interval.sql(dialect=DIALECT) for interval in intervals]
    if 0 in micros:
        raise SqlError(f"{function.kind}(…) at {position(function)}: {shown[micros.index(0)]} is empty; windows need "
                       "a length above zero")  # fmt: skip
    if function.kind == "CUMULATE" and micros[1] % micros[0]:
        raise SqlError(f"CUMULATE(…) at {position(function)}: its size {shown[1]} must be a whole number of its step "
                       f"{shown[0]}, as in Flink")  # fmt: skip
    offset = interval_micros(intervals[wanted], f"the {function.kind} offset", signed=True) if offsets else 0
    period = micros[1 if function.kind == "CUMULATE" else 0]  # the time between first windows' starts
    sizes, offset_text = [f"{m} us" for m in micros], f"{offset % period} us"  # as Flink: any offset, mod the period
    if function.kind == "TUMBLE":
        return tumbling(sizes[0], offset_text)
    if function.kind == "HOP":
        return sliding(sizes[1], sizes[0], offset_text)
    if function.kind == "CUMULATE":
        return cumulative(sizes[1], sizes[0], offset_text)
    return session(sizes[0])


def _unversioned(table: exp.Table) -> exp.Table:
    """The table of ``JOIN t FOR SYSTEM_TIME AS OF …``, read as it is now."""
    copy = table.copy()
    copy.set("version", None)
    return copy


def _window_join_windows(
    join: exp.Join, left: WindowTableFunction, right: WindowTableFunction, pairs: list[tuple[exp.Expr, exp.Expr]]
) -> tuple[WindowAssigner, list[tuple[exp.Expr, exp.Expr]]]:
    """A window join's windows (both inputs' must be the same, as in Flink) and its key
    equalities: the condition must equal both tables' window_start and window_end."""
    windows = _assigner(left)
    if windows.merging:
        raise SqlError(f"window join at {position(join)} of SESSION windows is not supported; join TUMBLE, HOP or "
                       "CUMULATE windows")  # fmt: skip
    if _assigner(right) != windows:
        shown = [f"{f.kind}(…, {', '.join(e.sql(dialect=DIALECT) for e in f.expressions)})" for f in (left, right)]
        raise SqlError(f"window join at {position(join)}: its tables are windowed differently ({shown[0]} and "
                       f"{shown[1]}); a window join needs the same windows on both, as in Flink")  # fmt: skip
    bounds = [p for p in pairs if all(isinstance(e, exp.Column) and e.name.lower() in _WINDOW_COLUMNS for e in p)]
    matched = {a.name.lower() for a, b in bounds if a.name.lower() == b.name.lower()}
    if matched != set(_WINDOW_COLUMNS) or len(bounds) != 2:
        raise SqlError(f"window join at {position(join)}: its condition must equal the tables' windows, e.g. ON "
                       "L.window_start = R.window_start AND L.window_end = R.window_end AND L.k = R.k")  # fmt: skip
    return windows, [p for p in pairs if p not in bounds]


def _without_windows(relation: Relation) -> Relation:
    """A windowed relation's columns without ``window_start``/``window_end``: the window join makes them."""
    sides = [
        Side(side.aliases, None if side.names is None else
             {w: n for w, n in side.names.items() if w not in _WINDOW_COLUMNS})
        for side in relation.sides
    ]  # fmt: skip
    order = [(w, n) for w, n in relation.order if w.lower() not in _WINDOW_COLUMNS]
    return Relation(relation.node, sides, order=order)


def _with_windows(joined: Relation, left_sides: int) -> Relation:
    """A window join's relation: both tables' ``window_start``/``window_end`` are its output's
    (one pair, after the keys); ``SELECT *`` lists them once, after the left table's columns."""
    windows = {name: name for name in _WINDOW_COLUMNS}
    for side in joined.sides:
        if side.names is not None:
            side.names.update(windows)
    left_order = sum(len(side.names or {}) - len(windows) for side in joined.sides[:left_sides])
    order = [*joined.order[:left_order], *windows.items(), *joined.order[left_order:]]
    return Relation(joined.node, joined.sides, order=order)


def _equalities(
    condition: exp.Expr | None, left: Relation, right: Relation, bound: Callable[[exp.Expr], bool]
) -> tuple[list[tuple[exp.Expr, exp.Expr]], list[exp.Expr]]:
    """The (left, right) expression pairs of ``condition``'s equalities between the two
    relations, and its other conjuncts (with the equalities that ``bound`` the join by time)."""
    pairs: list[tuple[exp.Expr, exp.Expr]] = []
    rest: list[exp.Expr] = []
    for conjunct in condition.flatten() if isinstance(condition, exp.And) else [condition] if condition else []:
        if isinstance(conjunct, exp.EQ) and not bound(conjunct):
            a, b = conjunct.this, conjunct.expression
            if belongs(a, left) and belongs(b, right) and not belongs(a, right) and not belongs(b, left):
                pairs.append((a, b))
                continue
            if belongs(b, left) and belongs(a, right) and not belongs(b, right) and not belongs(a, left):
                pairs.append((b, a))
                continue
        rest.append(conjunct)
    return pairs, rest


_GROUP_WINDOW_PARTS = {"START": nodes.WINDOW_START, "END": nodes.WINDOW_END}


def _group_window(query: exp.Select, relation: Relation, builder: PlanBuilder) -> None:
    """Flink's legacy group window, ``GROUP BY k, SESSION(ts, INTERVAL …)`` with
    ``SESSION_START(…)``/``SESSION_END(…)``, as the window table function it stands for."""
    group = query.args.get("group")
    windows = [
        key for key in (group.expressions if group else [])
        if isinstance(key, exp.Anonymous) and key.name.upper() in GROUP_WINDOWS
    ]  # fmt: skip
    if not windows or group is None:
        return
    if len(windows) > 1 or relation.window is not None:
        raise SqlError(f"GROUP BY at {position(group)} has more than one window; group by one")
    window = windows[0]
    kind = window.name.upper()
    time, *sizes = window.expressions
    event_time = event_time_at(builder.operators, relation.node)
    if not isinstance(time, exp.Column) or event_time is None or time.name.lower() != event_time.lower():
        raise SqlError(
            f"{kind}({time.sql(dialect=DIALECT)}, …) at {position(window)}: keyflow windows by the column a WATERMARK "
            f"is declared on ({event_time or 'none here'}); window by it"
        )
    relation.window = WindowTableFunction(this=kind, table=exp.to_table("t"), time=time, expressions=sizes)
    group.set("expressions", [*(k for k in group.expressions if k is not window), *map(exp.column, _WINDOW_COLUMNS)])

    def bounds(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.upper().startswith(f"{kind}_"):
            part = node.name.upper().removeprefix(f"{kind}_")
            if part not in _GROUP_WINDOW_PARTS:
                raise SqlError(f"{node.name.upper()}(…) at {position(node)} is not supported; use {kind}_START or "
                               f"{kind}_END")  # fmt: skip
            return exp.column(_GROUP_WINDOW_PARTS[part])
        return node

    query.set("expressions", [e.transform(bounds) for e in query.expressions])
    if query.args.get("having") is not None:
        query.set("having", query.args["having"].transform(bounds))


def _refuse_in_expressions(query: exp.Select, allowed: list[exp.Window]) -> None:
    """Constructs inside this query's own expressions (not its FROM) keyflow does not run yet;
    ``allowed``: the windows it runs (the ROW_NUMBER an outer query filters, OVER aggregates)."""
    for tree in own_nodes(query):
        for node in tree.walk():
            if isinstance(node, exp.Window) and not any(node is window for window in allowed):
                raise SqlError(_window_refusal(node))
            if isinstance(node, (exp.Subquery, exp.Select)):
                raise SqlError(f"a subquery at {position(node)} is not supported in an expression; read it in "
                               "FROM (SELECT …) and join it instead")  # fmt: skip


def _refuse_group_windows(query: exp.Select) -> None:
    """A TUMBLE/HOP/SESSION/CUMULATE call left in the query: not a GROUP BY window."""
    for tree in own_nodes(query):
        for node in tree.walk():
            if isinstance(node, exp.Anonymous) and node.name.upper() in WINDOW_FUNCTIONS:
                raise SqlError(
                    f"{node.name.upper()}(…) at {position(node)} is not supported here; use the window table "
                    f"function: FROM TABLE({node.name.upper()}(TABLE t, DESCRIPTOR(ts), …)) GROUP BY window_start, "
                    "window_end, …"
                )


def _output_names(expressions: list[exp.Expr]) -> list[str]:
    """An alias, else the column's (or ROW field's) name, else Flink's ``EXPR$i``."""
    names = []
    for index, expression in enumerate(expressions):
        if isinstance(expression, exp.Alias):
            names.append(expression.alias)
        elif isinstance(expression, (exp.Column, exp.Dot)):
            names.append(expression.name)
        else:
            names.append(f"EXPR${index}")
    unique: list[str] = []
    for name in names:  # as Flink's planner: a repeated name gets a number (dateTime, dateTime0)
        number, candidate = 0, name
        while candidate.lower() in {taken.lower() for taken in unique}:
            candidate, number = f"{name}{number}", number + 1
        unique.append(candidate)
    return unique


def _aggregate_calls(
    expressions: list[exp.Expr], having: exp.Expr | None, keys: list[str], types: Types
) -> tuple[dict[str, str], list[exp.Expr], exp.Expr | None]:
    """The aggregate calls of the select list and HAVING (by their output column), both
    rewritten to read those columns; every other column they read must be a key. ``types``:
    the input's, where known (Flink's AVG of integers is an integer)."""
    calls: dict[str, str] = {}
    rewritten = [_replace_aggregates(e.copy(), calls, types) for e in expressions]
    condition = _replace_aggregates(having.copy(), calls, types) if having is not None else None
    _check_grouped(rewritten, condition, keys, calls)
    return calls, rewritten, condition


def _check_grouped(
    expressions: list[exp.Expr], condition: exp.Expr | None, keys: list[str], calls: dict[str, str]
) -> None:
    for expression in [*expressions, *([condition] if condition is not None else [])]:
        for column in expression.find_all(exp.Column):
            if column.name not in keys and column.name not in calls:
                raise SqlError(f"column {column.name!r} at {position(column)} is neither in GROUP BY nor inside an "
                               "aggregate function; add it to GROUP BY or aggregate it")  # fmt: skip


def _replace_expression(tree: exp.Expr, key: exp.Expr, name: str) -> exp.Expr:
    """``tree`` with each copy of the GROUP BY expression ``key`` read from column ``name``."""
    return tree.transform(lambda node: exp.column(name) if node == key else node)


def _replace_aggregates(expression: exp.Expr, calls: dict[str, str], types: Types) -> exp.Expr:
    """Each aggregate call becomes a column ``__agg<i>`` of the aggregate's output; ``calls``
    collects them (one per distinct call). An AVG of a known integer type is read back as that
    type, truncated toward zero (Flink's; keyflow's aggregate keeps the exact mean)."""

    def replace(node: exp.Expr) -> exp.Expr:
        call = node.this if isinstance(node, exp.Filter) else node
        if not isinstance(call, exp.AggFunc):
            return node
        if type(call) not in AGGREGATES:
            raise SqlError(f"aggregate {node.sql(dialect=DIALECT)} at {position(node)} is not supported; keyflow SQL "
                           "aggregates with COUNT, COUNT(DISTINCT …), SUM, AVG, MIN and MAX")  # fmt: skip
        text = spark_sql(node)
        existing = {call: name for name, call in calls.items()}
        name = existing.get(text) or f"__agg{len(calls)}"
        calls[name] = text
        integer = integer_type(call.this, types) if isinstance(call, exp.Avg) else None
        return exp.column(name) if integer is None else exp.Cast(this=exp.column(name), to=integer)

    return expression.transform(replace)


def _upserts_without_row_kinds(builder: PlanBuilder, node_id: int) -> bool:
    """Whether ``node_id`` is (after stateless operators) an insert-only streaming aggregate."""
    node = builder.node(node_id)
    while isinstance(node, (nodes.SelectNode, nodes.FilterNode, nodes.WithColumnsNode)):
        node = builder.node(node.inputs[0])
    return isinstance(node, nodes.AggregateNode) and not node.changelog and builder.reads_unbounded([node.id])


def _same_column(a: exp.Expr, b: exp.Expr) -> bool:
    """Whether two resolved expressions read the same column (or ROW field): names compared as
    Spark resolves them, in any case, quoted or not."""
    if isinstance(a, exp.Column) and isinstance(b, exp.Column):
        return [part.name.lower() for part in a.parts] == [part.name.lower() for part in b.parts]
    return a == b


def _window_refusal(node: exp.Window) -> str:
    """Why a window function other than a filtered ROW_NUMBER or an OVER aggregate in the
    select list does not run."""
    if over_aggregates([node]):
        return (f"{node.sql(dialect=DIALECT)} at {position(node)}: an OVER aggregate belongs in the select list; "
                "filter or group by it in an outer query")  # fmt: skip
    if isinstance(node.this, exp.RowNumber):
        return (
            f"ROW_NUMBER() OVER at {position(node)} runs as Flink's Top-N only as a column of a derived table, "
            "view or WITH query that the query reading it filters: SELECT … FROM (SELECT …, ROW_NUMBER() OVER (…) "
            "AS rn FROM t) WHERE rn <= N"
        )
    if isinstance(node.this, (exp.Rank, exp.DenseRank)):
        name = "RANK" if isinstance(node.this, exp.Rank) else "DENSE_RANK"
        return f"{name}() OVER at {position(node)} is not supported yet; keyflow's Top-N numbers rows with ROW_NUMBER()"
    return (f"{node.this.sql(dialect=DIALECT)} OVER at {position(node)} is not supported yet; keyflow runs OVER "
            "aggregations with COUNT, SUM, AVG, MIN and MAX, and ROW_NUMBER() OVER as Top-N")  # fmt: skip
