"""Flink SQL's syntax as a sqlglot dialect: Spark's, plus what Flink scripts write that Spark
does not parse — ``ROW<…>`` types, ``WATERMARK FOR … AS …`` and the window table functions
``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), …))``. Expressions are still generated as Spark SQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.generators.spark import SparkGenerator
from sqlglot.parsers.spark import SparkParser
from sqlglot.tokenizer_core import TokenType

WINDOW_FUNCTIONS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")
GROUP_WINDOWS = ("TUMBLE", "HOP", "SESSION")  # also Flink's legacy GROUP BY windows


class WindowTableFunction(exp.Expression):
    """``TUMBLE|HOP|CUMULATE|SESSION(TABLE t [PARTITION BY k], DESCRIPTOR(ts), INTERVAL …, …)``."""

    arg_types: ClassVar[dict[str, bool]] = {
        "this": True,
        "table": True,
        "time": True,
        "expressions": True,
        "partition_by": False,
    }

    @property
    def kind(self) -> str:
        return str(self.this)


def _window_function(kind: str) -> Any:
    def parse(parser: Any) -> exp.Expression:
        if not parser._match(TokenType.TABLE):  # GROUP BY TUMBLE(ts, INTERVAL …): Flink's legacy group window
            legacy: exp.Expression = exp.Anonymous(this=kind, expressions=parser._parse_csv(parser._parse_disjunction))
            return legacy
        table = parser._parse_table_parts()
        partition_by: list[exp.Expression] = []
        if parser._match(TokenType.PARTITION_BY):  # one column, or several in parentheses
            wrapped = parser._match(TokenType.L_PAREN, advance=False)
            partition_by = parser._parse_wrapped_csv(parser._parse_column) if wrapped else [parser._parse_column()]
        parser._match(TokenType.COMMA)
        if not parser._match_text_seq("DESCRIPTOR"):
            parser.raise_error(f"{kind}(TABLE …, DESCRIPTOR(time column), …) expects DESCRIPTOR after the table")
        parser._match_l_paren()
        time = parser._parse_column()
        parser._match_r_paren()
        sizes = parser._parse_csv(parser._parse_disjunction) if parser._match(TokenType.COMMA) else []
        function: exp.Expression = parser.expression(
            WindowTableFunction(this=kind, table=table, time=time, expressions=sizes, partition_by=partition_by)
        )
        return function

    return parse


def _as_written(name: str) -> Callable[[list[exp.Expr]], exp.Expr]:
    return lambda args: exp.Anonymous(this=name, expressions=args)


class Flink(Spark):
    class Tokenizer(Spark.Tokenizer):
        # ROW<a INT> is STRUCT<a: INT>
        KEYWORDS: ClassVar[dict[Any, Any]] = {**Spark.Tokenizer.KEYWORDS, "ROW": TokenType.STRUCT}
        # Flink's literals are standard SQL: '' is a quote, a backslash is itself (Spark escapes them on output)
        STRING_ESCAPES: ClassVar[list[str]] = ["'"]

    class Parser(SparkParser):
        CONSTRAINT_PARSERS: ClassVar[dict[Any, Any]] = {
            **SparkParser.CONSTRAINT_PARSERS,
            "WATERMARK": lambda self: self.expression(
                exp.WatermarkColumnConstraint(
                    this=self._match(TokenType.FOR) and self._parse_column(),
                    expression=self._match(TokenType.ALIAS) and self._parse_disjunction(),
                )
            ),
        }
        SCHEMA_UNNAMED_CONSTRAINTS: ClassVar[set[Any]] = {*SparkParser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}
        FUNCTIONS: ClassVar[dict[Any, Any]] = {
            **SparkParser.FUNCTIONS,
            "REGEXP_EXTRACT": lambda args: exp.RegexpExtract(  # Flink's default group is 0, Spark's 1
                this=args[0], expression=args[1], group=args[2] if len(args) > 2 else exp.Literal.number(0)
            ),
            # as written: sqlglot's nodes would translate the pattern, fill in Spark's defaults or merge with LOCATE
            **{name: _as_written(name) for name in ("DATE_FORMAT", "STR_TO_MAP", "INSTR")},
        }
        # SESSION(…) is a window function here
        FUNC_TOKENS: ClassVar[set[Any]] = {*SparkParser.FUNC_TOKENS, TokenType.SESSION}
        FUNCTION_PARSERS: ClassVar[dict[Any, Any]] = {
            **SparkParser.FUNCTION_PARSERS,
            **{kind: _window_function(kind) for kind in WINDOW_FUNCTIONS},
        }

    class Generator(SparkGenerator):
        TRANSFORMS: ClassVar[dict[Any, Any]] = {
            **SparkGenerator.TRANSFORMS,
            WindowTableFunction: lambda self, e: self.func(
                e.kind,
                exp.var(f"TABLE {self.sql(e, 'table')}"),
                exp.Anonymous(this="DESCRIPTOR", expressions=[e.args["time"]]),
                *e.expressions,
            ),
        }
