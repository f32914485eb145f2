"""Flink's Top-N pattern in a query: ``FROM (SELECT …, ROW_NUMBER() OVER (PARTITION BY …
ORDER BY …) AS rn FROM t) [x] WHERE rn <= N``. Finds the derived table's row number, the
limit the reading query's WHERE puts on it, and whether that query reads the number. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from keyflow.sql.errors import SqlError, position
from keyflow.sql.scope import own_nodes
from keyflow.sql.statements import DIALECT


@dataclass(frozen=True)
class TopN:
    """A Top-N the reading query asks of a derived table: its rows numbered ``first`` to
    ``limit`` by the table's ``window`` (its ``ROW_NUMBER() OVER``); ``numbered``: the reading
    query reads the row number (constant where ``first == limit``, as Flink's
    RankNumberColumnRemoveRule makes it)."""

    window: exp.Window
    limit: int
    numbered: bool
    first: int = 1  # the first row number kept (Flink's rank range start)


def top_n_of(item: exp.Expr, query: exp.Select) -> TopN | None:
    """The Top-N of ``item`` (a FROM or JOIN operand of ``query``), or None: it has no ROW_NUMBER.
    Where ``query`` joins, the filter stays in its WHERE (it runs after the join, where an
    outer join may pad the ranked table with nulls); else it is taken out."""
    if not (isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select)):
        return None
    numbered = [e for e in item.this.expressions if isinstance(e.unalias(), exp.Window) and isinstance(
        e.unalias().this, exp.RowNumber)]  # fmt: skip
    if not numbered:
        return None
    window = numbered[0].unalias()
    if len(numbered) > 1 or not isinstance(numbered[0], exp.Alias):
        raise SqlError(f"ROW_NUMBER() OVER at {position(window)}: keyflow runs one, named (… AS rownum), per query as "
                       "Flink's Top-N; name it and filter it in the outer query")  # fmt: skip
    rank, alias = numbered[0].alias, (item.alias or "").lower()

    def is_rank(column: exp.Column) -> bool:
        qualified = (column.table or "").lower()
        return column.name.lower() == rank.lower() and qualified in ("", alias) and not column.args.get("db")

    where = query.args.get("where")
    conjuncts = _conjuncts(where.this) if where is not None else []
    on_rank = [c for c in conjuncts if any(is_rank(column) for column in c.find_all(exp.Column))]
    if not on_rank:
        raise SqlError(
            f"ROW_NUMBER() OVER at {position(window)} without a filter on {rank} in the outer query: keyflow runs "
            f"ROW_NUMBER as Flink's Top-N; add WHERE {rank} <= N (N = 1 deduplicates)"
        )
    bounds = [(conjunct, _rank_bounds(conjunct, is_rank)) for conjunct in on_rank]
    for conjunct, bound in bounds:
        if bound is None:
            raise SqlError(
                f"{conjunct.sql(dialect=DIALECT)} at {position(conjunct)}: keyflow's Top-N filters the row number "
                f"with {rank} <= N, {rank} < N, {rank} = M, {rank} >= M or {rank} BETWEEN M AND N (whole numbers, "
                "M and N at least 1)"
            )
    uppers = [bound[1] for _, bound in bounds if bound is not None and bound[1] is not None]
    if not uppers:
        raise SqlError(f"{on_rank[0].sql(dialect=DIALECT)} at {position(on_rank[0])} keeps every row: keyflow's "
                       f"Top-N needs an upper bound, {rank} <= N")  # fmt: skip
    first = max(bound[0] for _, bound in bounds if bound is not None)
    if first > min(uppers):
        raise SqlError(f"the filters on {rank} at {position(on_rank[0])} keep no row (from {first} to "
                       f"{min(uppers)}); widen the range")  # fmt: skip
    joined = bool(query.args.get("joins"))
    if not joined:
        rest = [c for c in conjuncts if all(c is not taken for taken in on_rank)]
        query.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    reads = [*own_nodes(query), *(join.args["on"] for join in query.args.get("joins") or [] if join.args.get("on"))]
    starred = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star and
                  (e.table or "").lower() in ("", alias)) for e in query.expressions)  # fmt: skip
    read = joined or starred or any(is_rank(column) for tree in reads for column in tree.find_all(exp.Column))
    return TopN(window, min(uppers), read, max(first, 1))


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    """The ANDed parts of ``condition``, through parentheses."""
    condition = condition.unnest()
    if isinstance(condition, exp.And):
        return [*_conjuncts(condition.this), *_conjuncts(condition.expression)]
    return [condition]


def _rank_bounds(conjunct: exp.Expr, is_rank: Callable[[exp.Column], bool]) -> tuple[int, int | None] | None:
    """The (first, last) row numbers ``conjunct`` keeps (``rn <= N``, ``rn < N``, ``rn = 1``,
    ``rn >= 1``, ``rn BETWEEN a AND b``, either way round; no last: unbounded), or None for
    another condition."""
    if isinstance(conjunct, exp.Between):
        column, low, high = conjunct.this, _number(conjunct.args["low"]), _number(conjunct.args["high"])
        ok = isinstance(column, exp.Column) and is_rank(column) and low is not None and high is not None
        return (low, high) if ok and low is not None and high is not None and high >= max(low, 1) else None
    kinds: dict[type[exp.Expr], str] = {exp.LTE: "<=", exp.LT: "<", exp.EQ: "=", exp.GTE: ">=", exp.GT: ">"}
    if type(conjunct) not in kinds:
        return None
    left, right = conjunct.this, conjunct.expression
    flipped = isinstance(right, exp.Column) and is_rank(right)
    column, value = (right, _number(left)) if flipped else (left, _number(right))
    if not (isinstance(column, exp.Column) and is_rank(column)) or value is None:
        return None
    kind = kinds[type(conjunct)]
    if flipped:  # N >= rn is rn <= N
        kind = {">=": "<=", ">": "<", "<=": ">=", "<": ">"}.get(kind, kind)
    bounds = {"<=": (1, value), "<": (1, value - 1), "=": (value, value), ">=": (value, None), ">": (value + 1, None)}
    first, last = bounds[kind]
    return None if last is not None and last < max(first, 1) else (first, last)


def _number(node: exp.Expr) -> int | None:
    return int(node.this) if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() else None
