"""The keyed exchange puts subtask i's key groups in Spark partition i, exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from keyflow import KeyedBatch, KeyedState, Pipeline, files
from keyflow.keygroups import assign_to_key_groups, key_group_range, subtasks_for_key_groups
from keyflow.runtime.exchange import routing_values
from tests.pipelines import FIXED, TEST_SPARK, write_clicks


@pytest.fixture(scope="module")
def clicks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    path = tmp_path_factory.mktemp("clicks")
    return path, write_clicks(path, rows=5_000, users=500)


@pytest.mark.jvm
@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
def test_aggregate_output_partition_is_the_owning_subtask(clicks: tuple[Path, pd.DataFrame], parallelism: int) -> None:
    path, _ = clicks
    p = Pipeline(parallelism=parallelism, config={**TEST_SPARK, "pipeline.max-parallelism": 128, **FIXED})
    result = (
        p.source(files(path))
        .key_by("user")
        .aggregate(clicks="count(*)")
        .with_columns(partition="spark_partition_id()")
        .to_pandas()
    )
    groups = assign_to_key_groups(result.user.to_numpy(dtype=object), 128)
    expected = subtasks_for_key_groups(128, parallelism, groups)
    np.testing.assert_array_equal(result.partition.to_numpy(), expected)
    assert sorted(result.partition.unique()) == list(range(parallelism))  # none empty, none shared


def record_subtask(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    rows = batch.data.num_rows
    return pa.table({"user": batch.data.column("user"), "subtask": pa.array(np.full(rows, batch.subtask))})


@pytest.mark.jvm
def test_process_runs_each_key_in_its_subtask(clicks: tuple[Path, pd.DataFrame]) -> None:
    path, frame = clicks
    p = Pipeline(parallelism=3, config={**TEST_SPARK, "pipeline.max-parallelism": 300, **FIXED})
    result = p.source(files(path)).key_by("user").process(record_subtask, schema="user string, subtask int").to_pandas()
    groups = assign_to_key_groups(result.user.to_numpy(dtype=object), 300)
    for subtask in range(3):
        first, last = key_group_range(300, 3, subtask)
        mine = groups[result.subtask.to_numpy() == subtask]
        assert len(mine) > 0
        assert mine.min() >= first
        assert mine.max() <= last
    assert len(result) == len(frame)


@pytest.mark.parametrize("parallelism", [1, 2, 5, 64, 1000])
def test_routing_values_hit_every_partition_once(parallelism: int) -> None:
    values = np.array(routing_values(parallelism), dtype=np.int32)
    partitions = assign_to_key_groups(values, parallelism, hash="spark")
    np.testing.assert_array_equal(partitions, np.arange(parallelism))
