"""A lookup join in Spark: a stream's rows enriched with a bounded table's, no state.

The table is read whole whenever the frame is built (at every micro-batch of a streaming
run), so a run sees the table's current files. Spark picks the join: a broadcast hash join
where the table's size estimate is under ``spark.sql.autoBroadcastJoinThreshold``, else it
shuffles both sides by the key. Keys compare as SQL's ``=``: a null key matches nothing.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyflow.errors import PlanError
from keyflow.plan.columns import join_clash_message, join_clashes
from keyflow.plan.nodes import LookupJoinNode
from keyflow.runtime.connected import check_join_keys

TABLE_KEY = "__table_key_{}"


def lookup_join(node: LookupJoinNode, stream: DataFrame, table: DataFrame, names: tuple[str, str]) -> DataFrame:
    """Output columns: the keys (named as the stream's), the stream's other columns, the table's."""
    check_join_keys(node, stream, table, names)
    others = [column for column in table.columns if column not in node.other_keys]
    clashes = join_clashes(node.other_keys, stream.columns, others)
    if clashes:
        raise PlanError(join_clash_message(node.name, clashes))
    aliases = [TABLE_KEY.format(i) for i in range(len(node.other_keys))]
    keyed = table.select(
        *[F.col(f"`{key}`").alias(alias) for key, alias in zip(node.other_keys, aliases, strict=True)],
        *[F.col(f"`{column}`") for column in others],
    )
    condition = reduce(
        lambda a, b: a & b,
        [stream[f"`{key}`"] == keyed[alias] for key, alias in zip(node.keys, aliases, strict=True)],
    )
    joined = stream.join(keyed, condition, node.how)
    rest = [column for column in stream.columns if column not in node.keys]
    return joined.select(*[stream[f"`{c}`"] for c in (*node.keys, *rest)], *[keyed[f"`{c}`"] for c in others])
