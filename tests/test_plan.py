"""Compiling pipelines into job graphs: parallelism, key groups, partitioners, chaining."""

from __future__ import annotations

import json

import pytest

from keyflow import Pipeline, Stream, console, datagen, parquet, random_float, sequence, zipf
from keyflow.errors import PlanError, RestoreError
from keyflow.plan.graph import JobGraph, Partitioner


def clicks(p: Pipeline, parallelism: int | None = None) -> Stream:
    source = datagen(rows=10, fields={"user": zipf(5, prefix="u"), "price": random_float(), "n": sequence()})
    return p.source(source, parallelism=parallelism)


def test_source_parallelism_differs_from_the_rest() -> None:
    """Seed 001: a source at its own parallelism, downstream keeps the default (rebalance)."""
    p = Pipeline(parallelism=4)
    clicks(p, parallelism=1).filter("price > 0").key_by("user").aggregate(n="count(*)").sink(parquet("out/x"))
    plan = p.plan()
    assert [v.parallelism for v in plan.vertices] == [1, 4, 4]
    assert [(e.source, e.target, e.partitioner, e.keys) for e in plan.edges] == [
        (0, 1, Partitioner.REBALANCE, ()),
        (1, 2, Partitioner.HASH, ("user",)),
    ]
    assert [op.kind for op in plan.vertices[2].operators] == ["aggregate", "sink"]  # chained: forward


def test_same_parallelism_chains_into_one_vertex() -> None:
    p = Pipeline(parallelism=2)
    clicks(p).filter("price > 0").select("user").sink(console())
    plan = p.plan()
    assert len(plan.vertices) == 1
    assert [op.kind for op in plan.vertices[0].operators] == ["source", "filter", "select", "sink"]
    assert plan.edges == ()


def test_fan_out_breaks_chains_and_sink_parallelism_rebalances() -> None:
    p = Pipeline(parallelism=2)
    source = clicks(p)
    source.sink(parquet("out/a"), parallelism=1)
    source.key_by("user").aggregate(n="count(*)").sink(parquet("out/b"))
    plan = p.plan()
    partitioners = sorted(edge.partitioner.value for edge in plan.edges)
    assert partitioners == ["hash", "rebalance"]


def test_default_max_parallelism_uses_the_keyflow_policy_and_config_overrides_it() -> None:
    p = Pipeline(parallelism=3)
    clicks(p).sink(console())
    assert p.plan().max_parallelism == 27720
    p = Pipeline(parallelism=3, config={"pipeline.max-parallelism": 128})
    clicks(p).sink(console())
    assert p.plan().max_parallelism == 128


def test_operator_parallelism_above_max_parallelism_is_a_plan_error() -> None:
    p = Pipeline(parallelism=2, config={"pipeline.max-parallelism": 8})
    clicks(p).key_by("user").aggregate(n="count(*)").set_name("per_user").set_parallelism(16).sink(console())
    with pytest.raises(PlanError, match=r"operator 'per_user' has parallelism 16, above pipeline.max-parallelism 8"):
        p.plan()


def test_plan_json_round_trip_records_k_and_hash() -> None:
    p = Pipeline(parallelism=2, config={"pipeline.name": "demo"})
    clicks(p).key_by("user").aggregate(n="count(*)").sink(parquet("out/x"))
    plan = p.plan()
    data = json.loads(plan.to_json())
    assert data["max_parallelism"] == 27720
    assert data["key_hash"] == "spark"
    assert data["name"] == "demo"
    assert JobGraph.from_dict(data) == plan
    assert "hash by user" in plan.render()


def test_operator_ids_repeat_when_the_same_pipeline_is_built_again() -> None:
    def build() -> JobGraph:
        p = Pipeline(parallelism=2)
        clicks(p).filter("price > 0").key_by("user").aggregate(n="count(*)").sink(parquet("out/x"))
        return p.plan()

    first, second = build(), build()
    assert first == second
    assert [op.id for v in first.vertices for op in v.operators] == [1, 2, 3, 4]
    assert [op.uid for v in first.vertices for op in v.operators] == [
        "source: datagen",
        "filter",
        "aggregate[user]",
        "sink: out/x",
    ]


def test_plan_of_another_format_version_is_refused() -> None:
    p = Pipeline(parallelism=2)
    clicks(p).sink(console())
    data = p.plan().to_dict()
    data["format_version"] = 99
    with pytest.raises(ValueError, match="plan format_version 99 is not supported"):
        JobGraph.from_dict(data)


def test_set_parallelism_on_a_stream() -> None:
    p = Pipeline(parallelism=2)
    clicks(p).select("user").set_parallelism(3).sink(console())
    plan = p.plan()
    assert [(op.kind, op.parallelism) for v in plan.vertices for op in v.operators] == [
        ("source", 2),
        ("select", 3),
        ("sink", 2),
    ]
    assert [edge.partitioner for edge in plan.edges] == [Partitioner.REBALANCE, Partitioner.REBALANCE]


def test_default_parallelism_comes_from_the_local_master() -> None:
    p = Pipeline(config={"spark.master": "local[3]"})
    clicks(p).sink(console())
    assert p.plan().default_parallelism == 3


def test_restore_refuses_another_key_hash() -> None:
    import dataclasses

    from keyflow.plan.restore import check_restorable

    p = Pipeline(parallelism=2)
    p.source(datagen(rows=10, fields={"k": sequence()})).key_by("k").aggregate(n="count(*)").sink(console())
    saved = p.plan()
    with pytest.raises(RestoreError, match=r"written with key hash 'flink', this pipeline uses 'spark'.*same hash"):
        check_restorable(dataclasses.replace(saved, key_hash="flink"), saved, None, False, "ckpt")


def test_rescaled_plan_keeps_k_and_explicit_parallelism() -> None:
    """What restart, live rescale and the autoscaler all use: a pure recompilation."""
    p = Pipeline(parallelism=2)
    clicks(p).select("user").set_parallelism(3).key_by("user").aggregate(n="count(*)").sink(console())
    plan = p.compile()
    rescaled = plan.rescaled(5)
    assert plan.explicit_parallelism == rescaled.explicit_parallelism == {"select": 3}
    assert (rescaled.parallelism, rescaled.max_parallelism) == (5, plan.max_parallelism)
    by_uid = {op.uid: op.parallelism for op in rescaled.graph.operators}
    assert by_uid == {"source: datagen": 5, "select": 3, "aggregate[user]": 5, "sink: console": 5}
    assert [op.uid for op in rescaled.graph.operators if op.keyed] == ["aggregate[user]"]
    assert plan.graph.default_parallelism == 2  # the original is unchanged (immutable)


def test_plan_of_a_pipeline_without_sinks_shows_its_streams() -> None:
    """A pipeline that ends in to_pandas() has a plan too (nothing else reads its last stream)."""
    p = Pipeline(parallelism=2)
    clicks(p).filter("price > 0").key_by("user").aggregate(n="count(*)")
    assert [op.kind for op in p.plan().operators] == ["source", "filter", "aggregate"]
    with pytest.raises(PlanError, match="the pipeline is empty"):
        Pipeline(parallelism=2).plan()


def test_only_a_distinct_aggregate_after_reinterpret_keeps_retracting_state() -> None:
    """Running partials cannot hold DISTINCT; a column whose name contains "distinct" is no DISTINCT."""
    p = Pipeline(parallelism=2)
    per_user = clicks(p).key_by("user").aggregate(distinct_users="count(*)", n="sum(n)").reinterpret_as_keyed("user")
    per_user.aggregate(total="sum(distinct_users)").set_name("running").sink(parquet("out/a"))
    per_user.aggregate(kinds="count(DISTINCT n)").set_name("distinct").sink(parquet("out/b"))
    layouts = {op.name: op.state.layout for op in p.compile().graph.operators if op.state is not None}
    assert layouts["running"] == "running"
    assert layouts["distinct"] == "retracting"
