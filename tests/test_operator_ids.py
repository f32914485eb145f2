"""Stable operator ids (Flink's ``uid``): state is matched by uid, so it survives pipeline changes.

Flink's own cases (StreamingJobGraphGeneratorNodeHashTest) are mirrored by name where keyflow
behaves the same; ``test_changed_operator_name`` is where it deliberately differs: Flink's
generated ids hash the topology and ignore names, keyflow's derived uids are the name and
keys and ignore the topology, so stateless operators can come and go.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from keyflow import Pipeline, console, datagen, log, parquet, sequence
from keyflow.errors import PlanError, RestoreError
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, append, config, events, expected_totals, read_output, running_total


def totals(tmp: Path, condition: str | None = None, name: str = "running_total", uid: str | None = None) -> Pipeline:
    pipeline = Pipeline(config=config(2))
    stream = pipeline.source(log(str(tmp / "log")))
    if condition is not None:
        stream = stream.filter(condition)
    keyed = stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq", name=name)
    (keyed.uid(uid) if uid else keyed).sink(parquet(tmp / "out"))
    return pipeline


def assert_output(tmp: Path, all_events: pd.DataFrame) -> None:
    got = read_output(tmp / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(all_events).reset_index(drop=True), check_dtype=False)


@pytest.mark.jvm
def test_state_survives_a_filter_inserted_upstream(spark, tmp_path: Path) -> None:
    """A stateless operator added before the keyed one changes no uid: the old checkpoint
    restores, and the totals continue from the state (pandas computes the expected answer)."""
    first = events(1_500, 100, start=0, seed=21)
    append(tmp_path / "log", first)
    totals(tmp_path).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert_output(tmp_path, first)

    second = events(1_500, 100, start=1_500, seed=22)
    append(tmp_path / "log", second)
    changed = totals(tmp_path, condition="amount >= 0")
    changed.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert 0 < (second["amount"] >= 0).sum() < len(second)  # the filter really drops rows
    assert_output(tmp_path, pd.concat([first, second[second["amount"] >= 0]]))


@pytest.mark.jvm
def test_uid_keeps_state_across_a_rename(spark, tmp_path: Path) -> None:
    """A keyed operator without a uid is identified by its name and keys; a renamed one keeps
    its state when given the old uid."""
    first = events(1_000, 80, start=0, seed=31)
    append(tmp_path / "log", first)
    totals(tmp_path).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    second = events(1_000, 80, start=1_000, seed=32)
    append(tmp_path / "log", second)
    renamed = (
        r"'totals_v2' \(uid 'totals_v2\[user\]'\) has no state .* holds 'running_total' \(uid 'running_total\[user\]'"
    )
    with pytest.raises(RestoreError, match=renamed):
        totals(tmp_path, name="totals_v2").run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    kept = totals(tmp_path, name="totals_v2", uid="running_total[user]")
    kept.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert_output(tmp_path, pd.concat([first, second]))


def test_derived_uids_ignore_other_operators() -> None:
    """Stateless operators, even one named like the keyed operator, change no keyed uid."""

    def uids(with_others: bool) -> list[str]:
        p = Pipeline(parallelism=2)
        stream = p.source(datagen(rows=10, fields={"k": sequence(), "j": sequence()}))
        if with_others:
            stream = stream.filter("k > 1").select("k", "j").map_batches(lambda b: b, name="aggregate[k]")
        stream.key_by("k").aggregate(n="count(*)").key_by("n").aggregate(m="count(*)").sink(console())
        return [op.uid for op in p.plan().operators if op.keyed]

    assert uids(with_others=False) == uids(with_others=True) == ["aggregate[k]", "aggregate[n]"]


@pytest.mark.jvm
def test_keyed_operators_that_share_a_name_and_keys_need_uids(spark, tmp_path: Path) -> None:
    """Their derived uids could swap state when the pipeline is built in another order,
    so a streaming run refuses them; explicit uids make them distinct."""
    append(tmp_path / "log", events(200, 10, start=0, seed=41))

    def branches(with_uids: bool) -> Pipeline:
        pipeline = Pipeline(config=config(2))
        stream = pipeline.source(log(str(tmp_path / "log")))
        for number, condition in enumerate(["amount > 0", "amount <= 0"]):
            counts = stream.filter(condition).key_by("user").aggregate(n="count(*)")
            (counts.uid(f"counts-{number}") if with_uids else counts).sink(parquet(tmp_path / f"out{number}"))
        return pipeline

    assert [op.uid for op in branches(False).plan().operators if op.keyed] == ["aggregate[user]", "aggregate[user]#2"]
    with pytest.raises(PlanError, match=r"keyed operators \['aggregate', 'aggregate'\] have the same name and keys"):
        branches(False).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    result = branches(True).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert sum(result.output_rows.values()) > 0


def test_manual_hash_assignment_collision_throws_exception() -> None:
    p = Pipeline(parallelism=2)
    stream = p.source(datagen(rows=10, fields={"k": sequence()}))
    counts = stream.key_by("k").aggregate(n="count(*)").set_name("counts").uid("state-a")
    counts.key_by("k").aggregate(m="count(*)").set_name("recounts").uid("state-a").sink(console())
    with pytest.raises(PlanError, match=r"operators 'counts' and 'recounts' both have uid 'state-a'.*its own"):
        p.plan()
    with pytest.raises(PlanError, match=r"uid '' is invalid; give a non-empty string without '/'"):
        stream.uid("")
    with pytest.raises(PlanError, match=r"uid 'a/b' is invalid"):
        stream.uid("a/b")


def test_an_explicit_uid_takes_precedence_over_a_name() -> None:
    """A user's uid that equals another operator's derived uid pushes that one to ``#2``."""
    p = Pipeline(parallelism=2)
    stream = p.source(datagen(rows=10, fields={"k": sequence()}))
    first = stream.key_by("k").aggregate(n="count(*)")
    first.key_by("k").aggregate(m="count(*)").uid("aggregate[k]").sink(console())
    assert [op.uid for op in p.plan().operators if op.keyed] == ["aggregate[k]#2", "aggregate[k]"]


def test_node_hash_identical_nodes() -> None:
    """Two identical operators on one input get distinct ids."""
    p = Pipeline(parallelism=2)
    source = p.source(datagen(rows=10, fields={"k": sequence()}))
    source.select("k").sink(console())
    source.select("k").sink(console())
    uids = [op.uid for op in p.plan().operators]
    assert len(set(uids)) == len(uids) == 5
    assert uids.count("select") == uids.count("select#2") == 1


def test_changed_operator_name() -> None:
    """Deliberately unlike Flink: a renamed keyed operator gets another derived uid (an
    explicit uid keeps it); a renamed stateless operator changes no keyed uid."""

    def keyed_uid(name: str, filter_name: str, uid: str | None = None) -> str:
        p = Pipeline(parallelism=2)
        counts = p.source(datagen(rows=10, fields={"k": sequence()})).filter("k > 0", name=filter_name)
        counts = counts.key_by("k").aggregate(n="count(*)").set_name(name)
        (counts.uid(uid) if uid else counts).sink(console())
        return next(op.uid for op in p.plan().operators if op.keyed)

    assert keyed_uid("A", "f") == keyed_uid("A", "g") == "A[k]"
    assert keyed_uid("B", "f") == "B[k]"
    assert keyed_uid("B", "f", uid="A[k]") == "A[k]"
