"""A SQL script as typed statements, parsed by sqlglot in keyflow's Flink dialect.

Supported: ``CREATE TABLE … WITH (…)`` (with computed columns and a ``WATERMARK``),
``CREATE [TEMPORARY] VIEW … AS SELECT …``, ``CREATE FUNCTION … LANGUAGE PYTHON``,
``INSERT INTO … SELECT …``, ``SET 'key' = 'value'``, ``EXPLAIN INSERT …``, ``EXECUTE
STATEMENT SET BEGIN … END`` and, for ``Pipeline.sql``, a bare ``SELECT``. Anything else
is a :class:`SqlError` naming the statement and its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from keyflow.changelog import OP
from keyflow.errors import PlanError
from keyflow.plan.durations import duration
from keyflow.sql.dialect import Flink
from keyflow.sql.errors import SqlError, position
from keyflow.sql.functions import spark_sql

DIALECT = Flink  # reads Flink's syntax; writes expressions as Spark SQL


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type: str  # Spark SQL type, e.g. "BIGINT", "DECIMAL(10, 2)"


@dataclass(frozen=True)
class Watermark:
    """``WATERMARK FOR column AS column - INTERVAL …``: bounded out-of-orderness by ``delay``."""

    column: str
    delay: int  # microseconds


@dataclass(frozen=True)
class CreateTable:
    name: str
    columns: tuple[ColumnDef, ...]  # the physical columns, which the connector reads or writes
    primary_key: tuple[str, ...]
    options: dict[str, str]
    where: str
    computed: tuple[tuple[str, str], ...] = ()  # (name, Spark SQL expression), computed after reading
    watermark: Watermark | None = None
    proctime: tuple[str, ...] = ()  # computed columns AS PROCTIME(): the processing time a row is read at
    partition_keys: tuple[str, ...] = ()  # PARTITIONED BY: a file sink's partition directories

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def readable_names(self) -> list[str]:
        """The columns a query reads: the physical ones, then the computed ones."""
        return [*self.column_names, *(name for name, _ in self.computed)]


@dataclass(frozen=True)
class CreateFunction:
    """``CREATE FUNCTION name AS 'package.module.function' LANGUAGE PYTHON``."""

    name: str
    path: str
    where: str


@dataclass(frozen=True)
class CreateView:
    name: str
    query: exp.Select
    where: str


@dataclass(frozen=True)
class SetOption:
    key: str
    value: str


@dataclass(frozen=True)
class Insert:
    target: str
    query: exp.Select
    explain: bool = False
    where: str = ""


@dataclass(frozen=True)
class Query:
    """A bare ``SELECT`` (``Pipeline.sql`` returns its stream)."""

    query: exp.Select
    where: str = ""


Statement = CreateTable | CreateView | CreateFunction | SetOption | Insert | Query


@dataclass
class _Reader:
    statements: list[Statement] = field(default_factory=list)
    in_statement_set: bool = False


def parse_script(text: str) -> list[Statement]:
    """Every statement of ``text``, in order."""
    reader = _Reader()
    for tree in _parse(text):
        if tree is None or isinstance(tree, exp.Semicolon):  # a comment after the last statement
            continue
        _read(tree, reader)
    if reader.in_statement_set:
        raise SqlError("EXECUTE STATEMENT SET BEGIN … has no END; close it with END;")
    return reader.statements


def _parse(text: str) -> list[Any]:
    try:
        import logging

        logging.getLogger("sqlglot").setLevel(logging.ERROR)  # EXPLAIN/EXECUTE are read as commands on purpose
        return list(sqlglot.parse(text, read=DIALECT))
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        where = f"line {first.get('line', '?')}, column {first.get('col', '?')}"
        near = f" near {first.get('highlight')!r}" if first.get("highlight") else ""
        raise SqlError(f"SQL syntax error at {where}{near}: {first.get('description', error)}") from None
    except TokenError as error:
        raise SqlError(f"SQL syntax error: {error}") from None


def _read(tree: exp.Expression, reader: _Reader) -> None:
    if isinstance(tree, exp.Command):
        _command(tree, reader)
    elif isinstance(tree, exp.EndStatement) or (isinstance(tree, exp.Command) and tree.name.upper() == "END"):
        if not reader.in_statement_set:
            raise SqlError("END without EXECUTE STATEMENT SET BEGIN")
        reader.in_statement_set = False
    elif isinstance(tree, exp.Create) and tree.kind == "VIEW":
        reader.statements.append(_create_view(tree))
    elif isinstance(tree, exp.Create) and tree.kind == "FUNCTION":
        reader.statements.append(_create_function(tree))
    elif isinstance(tree, exp.Create):
        reader.statements.append(_create_table(tree))
    elif isinstance(tree, exp.Set):
        reader.statements.extend(_set(tree))
    elif isinstance(tree, exp.Insert):
        reader.statements.append(_insert(tree, explain=False))
    elif isinstance(tree, exp.Select):
        reader.statements.append(Query(tree, position(tree)))
    else:
        kind = type(tree).__name__.upper()
        raise SqlError(
            f"{kind} statement at {position(tree)} is not supported; keyflow runs CREATE TABLE, CREATE VIEW, "
            "INSERT INTO … SELECT, SET, EXPLAIN and EXECUTE STATEMENT SET"
        )
    if reader.in_statement_set and reader.statements and not isinstance(reader.statements[-1], Insert):
        raise SqlError("a statement set (EXECUTE STATEMENT SET BEGIN … END) holds only INSERT INTO statements")


def _command(tree: exp.Command, reader: _Reader) -> None:
    """``EXPLAIN …`` and ``EXECUTE STATEMENT SET BEGIN …``, which sqlglot leaves as commands."""
    keyword = tree.name.upper()
    rest = tree.expression.name if isinstance(tree.expression, exp.Literal) else ""
    if keyword == "EXPLAIN":
        explained = [t for t in _parse(rest) if t is not None]
        if len(explained) != 1 or not isinstance(explained[0], exp.Insert):
            raise SqlError(f"EXPLAIN takes one INSERT INTO … SELECT statement, got {rest.strip()[:60]!r}")
        reader.statements.append(_insert(explained[0], explain=True))
        return
    words = rest.split(None, 3)
    if keyword == "EXECUTE" and [w.upper() for w in words[:3]] == ["STATEMENT", "SET", "BEGIN"]:
        if reader.in_statement_set:
            raise SqlError("EXECUTE STATEMENT SET BEGIN inside another statement set; close the first with END;")
        reader.in_statement_set = True
        for inner in _parse(words[3] if len(words) > 3 else ""):
            if inner is not None:
                _read(inner, reader)
        return
    if keyword == "END":
        _read(exp.EndStatement(), reader)
        return
    raise SqlError(
        f"{keyword} {rest.strip()[:40]} … is not supported; keyflow runs CREATE TABLE, CREATE VIEW, INSERT INTO … "
        "SELECT, SET, EXPLAIN and EXECUTE STATEMENT SET"
    )


def _create_view(tree: exp.Create) -> CreateView:
    """``CREATE [TEMPORARY] VIEW name AS SELECT …``: a named query, planned where it is read."""
    name = tree.this.name if isinstance(tree.this, exp.Table) else ""
    query = tree.expression
    if not name or not isinstance(query, exp.Select):
        raise SqlError(f"CREATE VIEW at {position(tree)} must be CREATE VIEW name AS SELECT …")
    return CreateView(name, query, f"view {name!r}")


def _create_function(tree: exp.Create) -> CreateFunction:
    """Flink's ``CREATE FUNCTION … AS '…' LANGUAGE PYTHON``; a Java class is named as such."""
    name = tree.this.name if isinstance(tree.this, exp.Table) else ""
    path = tree.expression.name if isinstance(tree.expression, exp.Literal) else ""
    properties = tree.args.get("properties")
    languages = [p for p in (properties.expressions if properties else []) if isinstance(p, exp.LanguageProperty)]
    language = languages[0].this.name.upper() if languages else "JAVA"
    if not name or not path:
        raise SqlError(f"CREATE FUNCTION at {position(tree)} must read CREATE FUNCTION name AS 'module.function' "
                       "LANGUAGE PYTHON")  # fmt: skip
    if language != "PYTHON":
        raise SqlError(
            f"CREATE FUNCTION at {position(tree)}: {name} AS '{path}' is a {language.title()} function; keyflow "
            f"runs Python functions: CREATE FUNCTION {name} AS 'package.module.function' LANGUAGE PYTHON"
        )
    return CreateFunction(name, path, f"function {name!r}")


def _create_table(tree: exp.Create) -> CreateTable:
    if tree.kind != "TABLE" or not isinstance(tree.this, exp.Schema):
        raise SqlError(
            f"CREATE {tree.kind} at {position(tree)} is not supported; declare CREATE TABLE name (…) WITH (…) or "
            "CREATE VIEW name AS SELECT …"
        )
    name = tree.this.this.name
    where = f"table {name!r}"
    columns: list[ColumnDef] = []
    computed: list[tuple[str, exp.Expr]] = []
    watermark: Watermark | None = None
    primary_key: tuple[str, ...] = ()
    for item in tree.this.expressions:
        if isinstance(item, exp.WatermarkColumnConstraint):
            if watermark is not None:
                raise SqlError(f"{where}: a second WATERMARK at {position(item)}; a table has one")
            watermark = _watermark(item, where)
        elif isinstance(item, exp.ColumnDef) and _computed(item) is not None:
            computed.append((item.name, _computed(item).this))  # type: ignore[union-attr]
        elif isinstance(item, exp.ColumnDef):
            kind = item.args.get("kind")
            if kind is None:
                raise SqlError(f"{where}: column {item.name!r} has no type ({position(item)})")
            if item.name.lower() == OP:
                raise SqlError(
                    f"{where}: column {item.name!r} ({position(item)}) has the name of the row-kind column keyflow "
                    f"gives changelogs ({OP!r}: +I, -U, +U, -D); rename it (a changelog log's {OP!r} is not declared)"
                )
            columns.append(ColumnDef(item.name, spark_type(kind)))
        elif isinstance(item, exp.PrimaryKey):
            primary_key = tuple(key.name for key in item.expressions)
            if "NOT ENFORCED" not in item.sql(dialect=DIALECT).upper():
                raise SqlError(
                    f"{where}: PRIMARY KEY ({', '.join(primary_key)}) must be declared NOT ENFORCED, as in Flink "
                    "(keyflow does not check uniqueness; it routes and keeps state by the key)"
                )
        else:
            raise SqlError(
                f"{where}: {item.sql(dialect=DIALECT)!r} ({position(item)}) is not supported in CREATE TABLE"
            )
    names = [column.name for column in columns] + [name for name, _ in computed]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SqlError(f"{where}: column(s) {twice} declared twice")
    if watermark is not None and watermark.column not in names:
        raise SqlError(f"{where}: WATERMARK FOR {watermark.column} names no column of the table {names}")
    missing = [key for key in primary_key if key not in names]
    if missing:
        raise SqlError(f"{where}: PRIMARY KEY column(s) {missing} are not columns of the table {names}")
    options: dict[str, str] = {}
    partition_keys: tuple[str, ...] = ()
    properties = tree.args.get("properties")
    for prop in properties.expressions if properties else []:
        if isinstance(prop, exp.PartitionedByProperty):
            partition_keys = _partition_keys(prop, [column.name for column in columns], where)
            continue
        if not isinstance(prop, exp.Property):
            raise SqlError(
                f"{where}: {prop.sql(dialect=DIALECT)!r} is not supported; give options in WITH ('key' = 'value')"
            )
        options[_literal(prop.this)] = _literal(prop.args.get("value"))
    if not options.get("connector") and "connector.type" in options:
        raise SqlError(
            f"{where} uses Flink's legacy 'connector.type' options, which Flink itself no longer reads; declare "
            f"'connector' = '{options['connector.type']}' and that connector's options"
        )
    if not options.get("connector"):
        raise SqlError(f"{where} has no connector; add WITH ('connector' = 'filesystem', …) (or datagen, log, …)")
    items = tree.this.expressions
    proctime = tuple(item.name for item in items if isinstance(item, exp.ColumnDef) and is_proctime(_computed(item)))
    if watermark is not None and watermark.column.lower() in {column.lower() for column in proctime}:
        raise SqlError(f"{where}: WATERMARK FOR {watermark.column} declares event time on a PROCTIME() column; "
                       "declare it on a timestamp column of the data (processing time needs no watermark)")  # fmt: skip
    computed_sql = tuple((column, _computed_sql(expression, columns)) for column, expression in computed)
    return CreateTable(
        name, tuple(columns), primary_key, options, where, computed_sql, watermark, proctime, partition_keys
    )


def _partition_keys(prop: exp.PartitionedByProperty, physical: list[str], where: str) -> tuple[str, ...]:
    """PARTITIONED BY (a, b): physical columns, each once, not all of them (a partitioned file
    holds the other columns; the partition's values are its directory names)."""
    said = f"PARTITIONED BY {prop.this.sql(dialect=DIALECT)} ({position(prop)})"
    keys = tuple(item.name for item in prop.this.expressions)
    if not all(isinstance(item, (exp.Identifier, exp.Column)) for item in prop.this.expressions):
        raise SqlError(f"{where}: {said} takes column names, as in Flink: PARTITIONED BY (dt, hm)")
    unknown = [key for key in keys if key not in physical]
    if unknown:
        raise SqlError(f"{where}: {said} names {unknown}, not physical columns of the table {physical}")
    if len(set(keys)) < len(keys):
        raise SqlError(f"{where}: {said} names a column twice")
    hidden = [key for key in keys if key[:1] in "_."]
    if hidden:
        raise SqlError(f"{where}: {said} names {hidden}: directories starting with '_' or '.' are hidden from "
                       "readers (Spark's and Hive's); rename the column")  # fmt: skip
    if len(keys) == len(physical):
        raise SqlError(f"{where}: {said} partitions by every column; leave at least one column in the files")
    return keys


def _computed(item: exp.ColumnDef) -> exp.ComputedColumnConstraint | None:
    for constraint in item.args.get("constraints") or []:
        if isinstance(constraint.args.get("kind"), exp.ComputedColumnConstraint):
            return constraint.args["kind"]  # type: ignore[no-any-return]
    return None


def _computed_sql(expression: exp.Expr, columns: list[ColumnDef]) -> str:
    """The Spark SQL of a computed column's ``expression`` (Flink's), with Flink's meanings
    that need the table's declared column types (integer division, DATE_FORMAT of a STRING)."""
    from keyflow.sql.types import declared, typed_meanings  # types reads CreateTable, declared here

    types = {column.name.lower(): kind for column in columns if (kind := declared(column.type)) is not None}
    return spark_sql(typed_meanings(expression.copy(), types))


def is_proctime(expression: exp.Expr | None) -> bool:
    """Whether ``expression`` is (or computes as) Flink's ``PROCTIME()``: a processing-time column."""
    if isinstance(expression, exp.ComputedColumnConstraint):
        expression = expression.this
    return isinstance(expression, exp.Anonymous) and expression.name.upper() == "PROCTIME"


def _watermark(item: exp.WatermarkColumnConstraint, where: str) -> Watermark:
    """Flink's ``WATERMARK FOR ts AS ts - INTERVAL 'n' unit`` (or ``AS ts``) as a bounded delay."""
    column, expression = item.this, item.expression
    if not isinstance(column, exp.Column) or expression is None:
        raise SqlError(f"{where}: WATERMARK at {position(item)} must read WATERMARK FOR column AS column - INTERVAL …")
    if isinstance(expression, exp.Column) and expression.name == column.name:
        return Watermark(column.name, 0)
    if (
        isinstance(expression, exp.Sub)
        and isinstance(expression.this, exp.Column)
        and expression.this.name == column.name
    ):
        return Watermark(column.name, interval_micros(expression.expression, f"{where}: the WATERMARK delay"))
    raise SqlError(
        f"{where}: WATERMARK FOR {column.name} AS {expression.sql(dialect=DIALECT)} ({position(item)}) is not "
        f"supported; keyflow takes a bounded delay: WATERMARK FOR {column.name} AS {column.name} - INTERVAL '5' SECOND"
    )


def interval_micros(node: exp.Expression, what: str, signed: bool = False) -> int:
    """``INTERVAL '10' SECOND`` (or ``INTERVAL '10 SECOND'``) in microseconds; with ``signed``
    also a negative one, written as Calcite reads them (``INTERVAL '-10' SECOND``,
    ``INTERVAL -'10' SECOND``, ``-INTERVAL '10' SECOND``)."""
    sign, interval = (-1, node.this) if isinstance(node, exp.Neg) else (1, node)
    if isinstance(interval, exp.Interval):
        value = interval.this
        if isinstance(value, exp.Neg):
            sign, value = -sign, value.this
        text, unit = value.name.strip(), interval.args.get("unit")
        if text[:1] in ("-", "+"):
            sign, text = (-sign if text[0] == "-" else sign), text[1:]
        try:
            micros = duration(f"{text} {unit.name if unit is not None else ''}".strip().lower(), what, zero=True)
        except PlanError:
            micros = None
        if micros is not None and (signed or sign > 0 or micros == 0):
            return sign * micros
        if micros is not None:
            raise SqlError(f"{what} at {position(node)} is {node.sql(dialect=DIALECT)}, a negative interval; write "
                           "a positive one")  # fmt: skip
    raise SqlError(f"{what} at {position(node)} is {node.sql(dialect=DIALECT)}; write an interval such as "
                   "INTERVAL '10' SECOND")  # fmt: skip


def spark_type(kind: exp.DataType) -> str:
    """The Spark SQL type of a declared column type (CHAR/VARCHAR are strings in Spark)."""
    if kind.this in (exp.DType.VARCHAR, exp.DType.CHAR, exp.DType.TEXT, exp.DType.NVARCHAR, exp.DType.NCHAR):
        return "STRING"
    return kind.sql(dialect=DIALECT)


def _literal(node: Any) -> str:
    if isinstance(node, exp.Literal):
        return str(node.this)
    if isinstance(node, (exp.Identifier, exp.Var, exp.Column)):
        return str(node.name)
    if isinstance(node, exp.Boolean):
        return "true" if node.this else "false"
    return str(node.sql(dialect=DIALECT)) if isinstance(node, exp.Expression) else str(node)


def _set(tree: exp.Set) -> list[SetOption]:
    found = []
    for item in tree.expressions:
        assignment = item.this if isinstance(item, exp.SetItem) else item
        if not isinstance(assignment, exp.EQ):
            raise SqlError(f"SET {item.sql(dialect=DIALECT)!r} is not 'key' = 'value'; write SET 'key' = 'value';")
        key = (
            assignment.this.sql(dialect=DIALECT) if isinstance(assignment.this, exp.Dot) else _literal(assignment.this)
        )
        found.append(SetOption(key.replace("`", ""), _literal(assignment.expression)))
    return found


def _insert(tree: exp.Insert, explain: bool) -> Insert:
    target = tree.this
    if isinstance(target, exp.Schema):
        raise SqlError(
            f"INSERT INTO {target.this.name} ({', '.join(c.name for c in target.expressions)}) at {position(tree)}: a "
            "column list is not supported; select the sink's columns in its order"
        )
    if not isinstance(target, exp.Table):
        raise SqlError(f"INSERT at {position(tree)} must name a table: INSERT INTO sink SELECT …")
    query = tree.expression
    if not isinstance(query, exp.Select):
        construct = type(query).__name__.upper() if query is not None else "nothing"
        raise SqlError(f"INSERT INTO {target.name} reads {construct} at {position(query)}; keyflow supports SELECT …")
    if tree.args.get("with_") is not None:  # WITH … INSERT INTO t SELECT …: the query's WITH
        query.set("with_", tree.args["with_"])
    return Insert(target.name, query, explain, position(tree))
