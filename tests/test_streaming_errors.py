"""Every bad streaming input gets an error naming the thing, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from keyflow import KeyflowError, Pipeline, PlanError, datagen, files, log, parquet, random_int
from keyflow.errors import CheckpointError, RestoreError
from tests.streams import (
    TOTAL_SCHEMA,
    TOTAL_STATE,
    append,
    config,
    events,
    expected_counts,
    latest_counts,
    read_output,
    running_total,
)


def totals(tmp: Path, name: str = "keyflow", **extra: object) -> Pipeline:
    pipeline = Pipeline(config=config(2, **{"pipeline.name": name, **extra}))
    pipeline.source(log(str(tmp / "log"))).key_by("user").process(
        running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq"
    ).sink(parquet(tmp / "out"))
    return pipeline


@pytest.fixture
def checkpointed(spark, tmp_path: Path) -> Path:
    """A log and a checkpoint with one committed run of ``totals``."""
    append(tmp_path / "log", events(300, 20, start=0, seed=1))
    totals(tmp_path, **{"pipeline.max-parallelism": 64}).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    return tmp_path


@pytest.mark.jvm
def test_other_max_parallelism_is_refused(checkpointed: Path) -> None:
    pipeline = totals(checkpointed, **{"pipeline.max-parallelism": 128})
    with pytest.raises(
        RestoreError, match=r"pipeline.max-parallelism=128 .* holds state in 64 key groups.* set it to 64"
    ):
        pipeline.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_unset_max_parallelism_is_read_from_the_checkpoint(checkpointed: Path) -> None:
    append(checkpointed / "log", events(100, 20, start=300, seed=2))
    result = totals(checkpointed).run(checkpoint=str(checkpointed / "ckpt"), available_now=True)
    assert result.plan.max_parallelism == 64  # not re-derived by the default policy (27720)


@pytest.mark.jvm
def test_checkpoint_of_another_pipeline_is_refused(checkpointed: Path) -> None:
    with pytest.raises(RestoreError, match=r"belongs to pipeline 'keyflow', not 'other'; use another checkpoint"):
        totals(checkpointed, "other").run(checkpoint=str(checkpointed / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_missing_and_unknown_operators(checkpointed: Path) -> None:
    changed = Pipeline(config=config(2))
    changed.source(log(str(checkpointed / "log"))).select("user", "amount").key_by("user").aggregate(
        total="sum(amount)"
    ).sink(parquet(checkpointed / "out2"))
    with pytest.raises(RestoreError, match=r"has no state in checkpoint .* another pipeline\? Start with a new"):
        changed.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)

    stateless = Pipeline(config=config(2, **{"pipeline.max-parallelism": 64}))
    stateless.source(log(str(checkpointed / "log"))).sink(parquet(checkpointed / "out3"))
    unclaimed = r"holds state of 'running_total' \(uid 'running_total\[user\]', process\).*ignore-unclaimed-state"
    with pytest.raises(RestoreError, match=unclaimed):
        stateless.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)
    dropping = Pipeline(config=config(2, **{"execution.state-recovery.ignore-unclaimed-state": "true"}))
    dropping.source(log(str(checkpointed / "log"))).sink(parquet(checkpointed / "out3"))
    dropping.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)  # allowed: the state is dropped


@pytest.mark.jvm
def test_changed_state_declaration_is_refused(checkpointed: Path) -> None:
    from keyflow import ValueState

    pipeline = Pipeline(config=config(2))
    pipeline.source(log(str(checkpointed / "log"))).key_by("user").process(
        running_total, TOTAL_SCHEMA, state={"total": ValueState("float64")}, order_by="seq"
    ).sink(parquet(checkpointed / "out"))
    with pytest.raises(
        RestoreError,
        match=r"cannot restore its state from checkpoint .*: it now keeps \{'total': 'double'\}, the checkpoint "
        r"\{'total': 'int64'\}\. Change it back",
    ):
        pipeline.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_a_first_run_that_failed_before_its_first_commit_never_blocks_the_corrected_pipeline(
    spark, tmp_path: Path
) -> None:
    """The first micro-batch fails (a bug in the function) after plan.json was written: the
    corrected pipeline, with other operators and state, starts over on that checkpoint."""
    data = events(600, 20, start=0, seed=4)
    append(tmp_path / "log", data)

    def broken(batch: object, state: object) -> None:
        raise ValueError("bug in my function")

    failing = Pipeline(config=config(2))
    failing.source(log(str(tmp_path / "log"))).key_by("user").process(
        broken, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq"
    ).sink(parquet(tmp_path / "out"))
    with pytest.raises(KeyflowError, match="bug in my function"):
        failing.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert (tmp_path / "ckpt" / "plan.json").exists()
    assert read_output(tmp_path / "out").empty

    corrected = Pipeline(config=config(2))
    corrected.source(log(str(tmp_path / "log"))).key_by("user").aggregate(events="count(*)", amount="sum(amount)").sink(
        parquet(tmp_path / "out")
    )
    corrected.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    got = latest_counts(tmp_path / "out")[["user", "events", "amount"]]
    pd.testing.assert_frame_equal(got, expected_counts(data), check_dtype=False)


@pytest.mark.jvm
def test_deleted_manifests_are_detected(checkpointed: Path) -> None:
    for manifest in (checkpointed / "ckpt" / "manifests").glob("*.json"):
        manifest.unlink()
    with pytest.raises(
        RestoreError, match=r"source has consumed batch \d+ but the newest state manifest is version -1"
    ):
        totals(checkpointed).run(checkpoint=str(checkpointed / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_non_checkpoint_directory_and_missing_checkpoint(spark, tmp_path: Path) -> None:
    append(tmp_path / "log", events(10, 2, start=0, seed=1))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"busy is not empty and has no keyflow plan.json"):
        totals(tmp_path).run(checkpoint=str(tmp_path / "busy"), available_now=True)
    with pytest.raises(PlanError, match=r"unbounded source, so it needs a checkpoint directory"):
        totals(tmp_path).run()


@pytest.mark.jvm
def test_streaming_reads_unbounded_sources_only(spark, tmp_path: Path) -> None:
    pipeline = Pipeline(config=config(2))
    pipeline.source(datagen(rows=10, fields={"k": random_int(1, 3)})).sink(parquet(tmp_path / "out"))
    with pytest.raises(PlanError, match=r"reads unbounded sources only.*bounded: \['source: datagen'\]"):
        pipeline.run(checkpoint=str(tmp_path / "ckpt"))


@pytest.mark.jvm
def test_aggregate_that_cannot_be_merged_is_refused(spark, tmp_path: Path) -> None:
    pipeline = Pipeline(config=config(2))
    source = datagen(rows=100, rows_per_second=1e6, fields={"k": random_int(1, 3), "v": random_int(1, 9)})
    pipeline.source(source).key_by("k").aggregate(n="count(distinct v)").sink(parquet(tmp_path / "out"))
    with pytest.raises(PlanError, match=r"n='count\(distinct v\)' cannot be kept as running state.*use process"):
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_bad_source_options(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"is not a keyflow log; create it with `keyflow log append"):
        log(str(tmp_path / "nolog"))
    with pytest.raises(PlanError, match=r"rows_per_second=-1 is invalid"):
        datagen(rows_per_second=-1, fields={"k": random_int(1, 3)})
    with pytest.raises(PlanError, match=r"datagen needs rows=N \(bounded\) or rows_per_second=R"):
        datagen(fields={"k": random_int(1, 3)})
    (tmp_path / "empty").mkdir()
    pipeline = Pipeline(config=config(1))
    pipeline.source(files(tmp_path / "empty", watch=True)).sink(parquet(tmp_path / "out"))
    with pytest.raises(Exception, match=r"watched directory .*empty has no files to take the schema from"):
        pipeline.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)


def test_state_named_like_a_key_is_refused(tmp_path: Path) -> None:
    from keyflow import ValueState

    p = Pipeline(config=config(1))
    keyed = p.source(datagen(rows=10, fields={"user": random_int(1, 3)})).key_by("user")
    with pytest.raises(PlanError, match=r"state 'user' has the name of a key column"):
        keyed.process(running_total, TOTAL_SCHEMA, state={"user": ValueState("int64")})
    with pytest.raises(PlanError, match=r"state '__x' .* starts with '__'"):
        keyed.process(running_total, TOTAL_SCHEMA, state={"__x": ValueState("int64")})


@pytest.mark.jvm
def test_lost_source_checkpoint_is_detected(checkpointed: Path) -> None:
    import shutil

    shutil.rmtree(checkpointed / "ckpt" / "source")
    append(checkpointed / "log", events(50, 20, start=300, seed=7))
    with pytest.raises(RestoreError, match=r"state is at micro-batch \d+ but Spark.s source checkpoint .* deleted"):
        totals(checkpointed).run(checkpoint=str(checkpointed / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_inferred_source_schema_is_fixed_by_the_first_run(spark, tmp_path: Path) -> None:
    import pandas as pd

    incoming = tmp_path / "in"
    incoming.mkdir()
    pd.DataFrame({"k": ["a"], "n": [1]}).to_json(incoming / "a.json", orient="records", lines=True)

    def run() -> None:
        p = Pipeline(config=config(1))
        p.source(files(incoming, format="json", watch=True)).sink(parquet(tmp_path / "out"))
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    run()
    pd.DataFrame({"k": ["b"], "n": [1.5]}).to_json(incoming / "b.json", orient="records", lines=True)
    with pytest.raises(RestoreError, match=r"now reads struct<k:string,n:double> but .* started with .*n:bigint"):
        run()


@pytest.mark.jvm
def test_restart_removes_output_the_checkpoint_does_not_have(checkpointed: Path) -> None:
    stray = checkpointed / "out" / "part-b0000000099-00000.snappy.parquet"
    stray.write_bytes((checkpointed / "out").glob("part-b0000000000-*").__next__().read_bytes())
    append(checkpointed / "log", events(20, 20, start=300, seed=8))
    totals(checkpointed).run(checkpoint=str(checkpointed / "ckpt"), available_now=True)
    assert not stray.exists()


@pytest.mark.jvm
def test_rescale_events_are_logged_when_a_batch_commits(checkpointed: Path) -> None:
    from keyflow.state.checkpoint import Checkpoint

    checkpoint = Checkpoint(str(checkpointed / "ckpt"))
    pipeline = totals(checkpointed, **{"parallelism.default": 3})
    pipeline.run(checkpoint=str(checkpointed / "ckpt"), available_now=True)  # no new data: nothing committed
    assert checkpoint.events() == []
    append(checkpointed / "log", events(20, 20, start=300, seed=9))
    totals(checkpointed, **{"parallelism.default": 3}).run(checkpoint=str(checkpointed / "ckpt"), available_now=True)
    (event,) = checkpoint.events()
    assert (event["from"], event["to"], event["reason"], event["batch"]) == (
        2,
        3,
        "restart",
        checkpoint.manifests.versions()[-1],
    )


@pytest.mark.jvm
def test_stop_during_a_batch_is_not_a_failure(spark, tmp_path: Path) -> None:
    import time

    append(tmp_path / "log", events(200, 10, start=0, seed=1))

    def slow(batch, state):
        time.sleep(4)
        return running_total(batch, state)

    p = Pipeline(config=config(1))
    p.source(log(str(tmp_path / "log"))).key_by("user").process(
        slow, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq"
    ).sink(parquet(tmp_path / "out"))
    job = p.start(checkpoint=str(tmp_path / "ckpt"))
    deadline = time.time() + 60
    while not list((tmp_path / "ckpt" / "source" / "offsets").glob("0")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)  # the batch is running now
    job.stop()
    job.await_termination()
    assert job.status == "stopped"


@pytest.mark.jvm
def test_two_jobs_on_one_checkpoint_are_refused(spark, tmp_path: Path) -> None:
    append(tmp_path / "log", events(100, 10, start=0, seed=1))
    first = totals(tmp_path).start(checkpoint=str(tmp_path / "ckpt"))
    try:
        with pytest.raises(CheckpointError, match=r"ckpt is in use by another running job; stop it first"):
            totals(tmp_path).start(checkpoint=str(tmp_path / "ckpt"))
    finally:
        first.stop()
    totals(tmp_path).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)  # free again after stop()


@pytest.mark.jvm
def test_more_bad_inputs(spark, tmp_path: Path) -> None:
    import threading

    from keyflow import ConfigError

    append(tmp_path / "log", events(10, 2, start=0, seed=1))
    with pytest.raises(PlanError, match=r"log rows_per_batch=0 is invalid; it must be a positive integer"):
        log(str(tmp_path / "log"), rows_per_batch=0)
    with pytest.raises(PlanError, match=r"datagen rows_per_batch=True is invalid"):
        datagen(rows_per_second=10, rows_per_batch=True, fields={"k": random_int(1, 3)})
    with pytest.raises(ConfigError, match=r"execution.state-recovery.ignore-unclaimed-state='yes' is invalid; use"):
        Pipeline(config={"execution.state-recovery.ignore-unclaimed-state": "yes"})

    job = totals(tmp_path).start(checkpoint=str(tmp_path / "ckpt"))
    try:
        with pytest.raises(PlanError, match=r"rescale\(0\): parallelism must be a positive integer"):
            job.rescale(0)
    finally:
        job.stop()

    endless = Pipeline(config=config(1))
    endless.source(datagen(rows_per_second=10, fields={"k": random_int(1, 3)})).sink(parquet(tmp_path / "o1"))
    with pytest.raises(KeyflowError, match=r"datagen without rows= never ends; give rows=N"):
        endless.run(checkpoint=str(tmp_path / "c1"), available_now=True)

    lock = threading.Lock()

    def holds_a_lock(batch, state):
        with lock:
            return running_total(batch, state)

    unpicklable = Pipeline(config=config(1))
    unpicklable.source(log(str(tmp_path / "log"))).key_by("user").process(
        holds_a_lock, TOTAL_SCHEMA, state=TOTAL_STATE, name="locked"
    ).sink(parquet(tmp_path / "o2"))
    with pytest.raises(KeyflowError, match=r"operator 'locked': its function cannot be sent to Spark's Python workers"):
        unpicklable.run(checkpoint=str(tmp_path / "c2"), available_now=True)


def test_committed_output_of_a_removed_sink_is_not_lost(tmp_path: Path) -> None:
    """A version whose staged output was committed but not yet moved (a crash between the
    two) cannot be restored by a pipeline without that sink: the error says what to do."""
    from keyflow.runtime.streaming.commit import publish
    from keyflow.state.manifests import Manifest

    pipeline = Pipeline(config=config(2))
    append(tmp_path / "log", events(10, 3, start=0, seed=1))
    pipeline.source(log(str(tmp_path / "log"))).sink(parquet(tmp_path / "new"))
    staged = tmp_path / "old" / "_keyflow_staging" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"committed rows")
    moves = [[str(staged), str(tmp_path / "old" / "part-b0000000003-00000.parquet")]]
    manifest = Manifest(3, 2, 64, {}, [{"uid": f"sink: {tmp_path / 'old'}", "moves": moves}])
    with pytest.raises(
        RestoreError, match=r"version 3 holds committed output of sink uid 'sink: .*old'.*run the pipeline"
    ):
        publish(pipeline.compile(), manifest)
    staged.unlink()  # once moved into place (by the old pipeline), the new one restores fine
    publish(pipeline.compile(), manifest)
