"""What a query's ``FROM`` makes readable: the rows of one node and, for each table it joined,
the names its columns have in those rows. Resolves ``t.col`` and ``col`` to them. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from keyflow.sql.dialect import WindowTableFunction
from keyflow.sql.errors import SqlError, position
from keyflow.sql.statements import DIALECT

QUERY_PARTS = ("expressions", "where", "group", "having")


@dataclass
class Side:
    """One table of a FROM: the names that qualify it, and each column's name in the rows
    (None: a view of the Python API, whose columns are not known)."""

    aliases: set[str]
    names: dict[str, str] | None  # column as written (lower case) -> its name in the rows

    def has(self, column: str) -> bool:
        return self.names is not None and column.lower() in self.names


@dataclass
class Relation:
    """What a ``FROM`` reads: the node of its rows, its tables (several after a join), and the
    window table function whose windows the query's ``GROUP BY`` aggregates."""

    node: int
    sides: list[Side]
    window: WindowTableFunction | None = None
    order: list[tuple[str, str]] = field(default_factory=list)  # (column as written, name in rows), for *

    @classmethod
    def of(cls, node: int, columns: list[str] | None, aliases: set[str]) -> Relation:
        names = None if columns is None else {column.lower(): column for column in columns}
        return cls(node, [Side(aliases - {""}, names)], order=[(c, c) for c in columns or []])

    @property
    def columns(self) -> list[str] | None:
        """The columns ``SELECT *`` reads (None where a side's are unknown)."""
        if any(side.names is None for side in self.sides):
            return None
        return [name for _, name in self.order]


def own_nodes(query: exp.Select) -> list[exp.Expr]:
    """The trees of this query's select list, WHERE, GROUP BY and HAVING (not its FROM)."""
    trees: list[exp.Expr] = []
    for part in QUERY_PARTS:
        value = query.args.get(part)
        trees.extend(value if isinstance(value, list) else [value] if value is not None else [])
    return trees


def resolve(query: exp.Select, relation: Relation) -> None:
    """Each column of ``query`` named as it is in the relation's rows: ``t.col`` by table ``t``,
    ``col`` by the one table that has it; ``s.f``, where ``s`` is a ROW column, stays."""
    resolve_trees(own_nodes(query), relation)


def resolve_trees(trees: list[exp.Expr], relation: Relation) -> None:
    """:func:`resolve` for the columns of ``trees``."""
    for tree in trees:
        for column in list(tree.find_all(exp.Column)):
            if column.is_star:
                continue
            found = _found(column, relation)
            if found is not None:
                column.set("table", None)
                if found != column.name:
                    identifier = exp.to_identifier(found, quoted=True)
                    identifier.meta.update(column.this.meta)  # keeps the position errors name
                    column.set("this", identifier)


def _found(column: exp.Column, relation: Relation) -> str | None:
    """The name ``column`` has in the rows; None to leave it as written."""
    name, table = column.name, column.table
    if table:
        sides = [side for side in relation.sides if table in side.aliases]
        if not sides:
            if any(side.has(table) for side in relation.sides):
                return None  # a field of a ROW column
            raise SqlError(f"column {column.sql(dialect=DIALECT)} at {position(column)} names table {table!r}, "
                           "which the query does not read")  # fmt: skip
        side = sides[0]
        if side.names is None:
            return name
        if name.lower() not in side.names:
            raise SqlError(f"column {column.sql(dialect=DIALECT)} at {position(column)}: {table!r} has no column "
                           f"{name!r}; it has {sorted(side.names.values())}")  # fmt: skip
        return side.names[name.lower()]
    having = [side for side in relation.sides if side.has(name)]
    if not having and name.lower() == "window_time" and relation.window is not None:
        raise SqlError(f"column window_time at {position(column)}: keyflow gives Flink's window_time (window_end "
                       "less a millisecond) in a window aggregation's select list, GROUP BY and HAVING only; "
                       "elsewhere write window_end - INTERVAL '0.001' SECOND in the query that reads the "
                       "windows")  # fmt: skip
    if not having and all(side.names is not None for side in relation.sides):
        known = sorted({column for side in relation.sides for column in (side.names or {}).values()})
        raise SqlError(f"column {name!r} at {position(column)} is not a column of the tables read; they have "
                       f"{[k for k in known if not k.startswith('__')]}")  # fmt: skip
    if len(having) > 1:
        tables = [sorted(side.aliases)[0] for side in having]
        raise SqlError(f"column {name!r} at {position(column)} is ambiguous: tables {tables} both have it; qualify it "
                       f"as {tables[0]}.{name}")  # fmt: skip
    return having[0].names[name.lower()] if having and having[0].names is not None else None


def belongs(tree: exp.Expr, relation: Relation) -> bool:
    """Whether every column ``tree`` reads is one of the relation's (and it reads one)."""
    columns = list(tree.find_all(exp.Column))
    return bool(columns) and all(_readable(column, relation) for column in columns)


def _readable(column: exp.Column, relation: Relation) -> bool:
    if column.table:
        return any(column.table in side.aliases or side.has(column.table) for side in relation.sides)
    return any(side.has(column.name) for side in relation.sides)


def expand_star(expressions: list[exp.Expr], relation: Relation) -> list[exp.Expr]:
    """``*`` (or ``t.*``) as the relation's columns (``t``'s), named as in its rows: a joined
    table's column whose name the other has is ``name0`` there, as in Flink."""
    expanded: list[exp.Expr] = []
    for expression in expressions:
        star = isinstance(expression, exp.Star) or (isinstance(expression, exp.Column) and expression.is_star)
        if not star:
            expanded.append(expression)
            continue
        table = expression.table if isinstance(expression, exp.Column) else ""
        sides = [side for side in relation.sides if not table or table in side.aliases]
        if table and not sides:
            raise SqlError(f"{table}.* at {position(expression)} names no table the query reads")
        if any(side.names is None for side in sides):
            raise SqlError("SELECT * over a view registered from Python: name its columns")
        names = {name for side in sides for name in (side.names or {}).values()}
        expanded.extend(exp.column(name, quoted=True) for _, name in relation.order if name in names)
    return [e for e in expanded if not (isinstance(e, exp.Column) and e.name.startswith("__"))]
