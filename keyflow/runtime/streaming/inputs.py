"""Several unbounded sources in one streaming query: each micro-batch holds rows of all of them.

Spark runs one query per keyflow job, so its offsets and keyflow's state commit together. With
several sources the query reads their union: each source's rows packed as one struct column
of its own, tagged with the source's position; a micro-batch is split back into one frame
per source by the tag, a filter Spark's optimizer folds into the union (the other sources'
scans drop out of each frame's plan). One source is read as it is, with no tag.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from keyflow.runtime.operators import packed_rows

SOURCE_TAG = "__keyflow_source"


def _packed(position: int) -> str:
    return f"__keyflow_source_{position}"


def tagged_union(frames: Sequence[DataFrame]) -> DataFrame:
    """The rows of every frame, each source's as a struct column, tagged with its position."""
    if len(frames) == 1:
        return frames[0]
    packed = packed_rows(frames)
    tagged = [
        frame.select(
            F.lit(position).alias(SOURCE_TAG),
            *[packed[other][0 if other == position else 1].alias(_packed(other)) for other in range(len(frames))],
        )
        for position, frame in enumerate(frames)
    ]
    union = tagged[0]
    for frame in tagged[1:]:
        union = union.union(frame)
    return union


def split_sources(batch: DataFrame, source_ids: Sequence[int]) -> dict[int, DataFrame]:
    """A micro-batch of :func:`tagged_union`'s rows as one frame per source (by plan node id)."""
    if len(source_ids) == 1:
        return {source_ids[0]: batch}
    return {
        source_id: batch.filter(F.col(SOURCE_TAG) == F.lit(position)).select(f"{_packed(position)}.*")
        for position, source_id in enumerate(source_ids)
    }
