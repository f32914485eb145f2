"""The adaptive scheduler wired to a real local Spark: local[2] offers 2 slots; the log,
the upper bound, restarts, the timeline command and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from keyflow import Pipeline, log, parquet
from keyflow.cli.app import app
from keyflow.errors import EngineError, PlanError
from keyflow.runtime.autoscale import Autoscaler
from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig, State
from keyflow.state.checkpoint import Checkpoint
from tests.pipelines import TEST_SPARK
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, append, events, expected_totals, read_output, running_total

runner = CliRunner()
ADAPTIVE = {
    **TEST_SPARK,
    "execution.checkpointing.interval": "0 s",
    "jobmanager.scheduler": "adaptive",
    "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "0 s",
}


def adaptive_pipeline(tmp: Path, **extra: object) -> Pipeline:
    pipeline = Pipeline(config={**ADAPTIVE, **extra})
    stream = pipeline.source(log(str(tmp / "log"), rows_per_batch=700))
    stream.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
        parquet(tmp / "out")
    )
    return pipeline


def scheduler_log(checkpoint: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (checkpoint / "scheduler.jsonl").read_text().splitlines()]


@pytest.mark.jvm
def test_runs_at_the_cores_spark_has_and_logs_every_decision(spark, tmp_path: Path) -> None:
    data = events(2_000, 100, start=0, seed=7)
    append(tmp_path / "log", data)
    result = adaptive_pipeline(tmp_path).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    assert {batch.parallelism for batch in result.batches} == {2}  # local[2]: two slots, no upper bound
    records = scheduler_log(tmp_path / "ckpt")
    assert [r["kind"] for r in records[:2]] == ["start", "decision"]
    assert [r["time"] for r in records] == sorted(r["time"] for r in records)
    assert [r["slots"] for r in records if r["kind"] == "resources"] == [2]
    decisions = [(r["state"], r["from"], r["to"]) for r in records if r["kind"] == "decision"]
    assert decisions == [("WaitingForResources", 0, 0), ("Executing", 0, 2), ("Finished", 2, 2)]
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)


@pytest.mark.jvm
def test_parallelism_default_is_the_upper_bound_and_a_restart_follows_the_slots(spark, tmp_path: Path) -> None:
    first, second = events(1_500, 80, start=0, seed=8), events(1_500, 80, start=1_500, seed=9)
    append(tmp_path / "log", first)
    # The bound is reached at once: no stabilization wait (it is 10 min here).
    bounded = adaptive_pipeline(
        tmp_path, **{"parallelism.default": 1, "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "10 min"}
    )
    result = bounded.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert {batch.parallelism for batch in result.batches} == {1}
    executing = [r for r in scheduler_log(tmp_path / "ckpt") if r.get("state") == "Executing"]
    assert executing[0]["reason"] == "all desired resources available"

    append(tmp_path / "log", second)
    result = adaptive_pipeline(tmp_path).run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    assert {batch.parallelism for batch in result.batches} == {2}
    history = [(e["from"], e["to"], e["reason"]) for e in Checkpoint(str(tmp_path / "ckpt")).events()]
    assert history == [(1, 2, "adaptive scheduler: sufficient resources for 0 s (resource-stabilization-timeout)")]
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    expected = expected_totals(pd.concat([first, second])).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)

    shown = runner.invoke(app, ["timeline", str(tmp_path / "ckpt"), "--png", str(tmp_path / "timeline.png")])
    assert shown.exit_code == 0, shown.output
    assert "run 1" in shown.output
    assert "run 2" in shown.output
    assert "all desired" in shown.output  # (the table wraps the reason)
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    raw = runner.invoke(app, ["timeline", str(tmp_path / "ckpt"), "--json", "--png", str(tmp_path / "t.png")])
    assert raw.exit_code == 0, raw.output
    assert raw.stderr == f"wrote {tmp_path / 't.png'}\n"
    shown_json = json.loads(raw.stdout)  # one object, like every other --json
    assert shown_json["checkpoint"] == str(tmp_path / "ckpt")
    assert shown_json["records"] == scheduler_log(tmp_path / "ckpt")
    assert [[p for _, p in run["parallelism"]] for run in shown_json["runs"]] == [[0, 1], [0, 2]]


@pytest.mark.jvm
def test_manual_rescale_is_refused_while_adaptive(spark, tmp_path: Path) -> None:
    append(tmp_path / "log", events(100, 10, start=0, seed=1))
    job = adaptive_pipeline(tmp_path).start(checkpoint=str(tmp_path / "ckpt"))
    try:
        assert job.scheduler_state == "Executing"
        with pytest.raises(PlanError, match=r"adaptive scheduler sets the parallelism.*parallelism\.default"):
            job.rescale(1)
    finally:
        job.stop()
    assert job.scheduler_state == "Finished"
    assert scheduler_log(tmp_path / "ckpt")[-2]["state"] == "Canceling"


def test_timeline_of_a_checkpoint_without_the_adaptive_scheduler(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    not_a_checkpoint = runner.invoke(app, ["timeline", str(tmp_path / "ckpt")])
    assert not_a_checkpoint.exit_code == 2
    assert "is not a keyflow checkpoint (no plan.json)" in not_a_checkpoint.output
    (tmp_path / "ckpt" / "plan.json").write_text('{"checkpoint_id": "x", "plan": {}}')
    shown = runner.invoke(app, ["timeline", str(tmp_path / "ckpt")])
    assert shown.exit_code != 0
    assert "no scheduler.jsonl" in shown.output
    assert "jobmanager.scheduler=adaptive" in shown.output


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_no_slots_for_the_wait_timeout_fails_with_the_fix(tmp_path: Path) -> None:
    """The autoscaler's own loop (Spark's slots replaced by a list we change): every change is
    logged with the executors added and lost; no slots for resource-wait-timeout is an error."""
    clock, offered = FakeClock(), [(1, frozenset({"0"}))]
    config = SchedulerConfig(max_parallelism=128, resource_stabilization_timeout=2, resource_wait_timeout=30)
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    autoscaler = Autoscaler(AdaptiveScheduler(config, clock), lambda: offered[-1], checkpoint, "run-1")
    autoscaler.scheduler.start()
    assert autoscaler.poll() is State.WAITING_FOR_RESOURCES
    clock.now += 2
    assert autoscaler.poll() is State.EXECUTING
    offered.append((0, frozenset()))  # the only executor is lost
    clock.now += 1
    assert autoscaler.poll() is State.WAITING_FOR_RESOURCES
    clock.now += 29.9
    assert autoscaler.poll() is State.WAITING_FOR_RESOURCES
    clock.now += 0.1
    assert autoscaler.poll() is State.FINISHED  # as Flink: the job fails (no Failing state on this path)
    with pytest.raises(EngineError, match=r"no executor cores when the resource-wait-timeout \(30 s"):
        raise autoscaler.failure()
    autoscaler.close("failed", autoscaler.failure())  # what the job does when it stops

    records = scheduler_log(tmp_path / "ckpt")
    resources = [(r["slots"], r["added"], r["lost"]) for r in records if r["kind"] == "resources"]
    assert resources == [(1, ["0"], []), (0, [], ["0"])]
    states = [r["state"] for r in records if r["kind"] == "decision"]
    assert states == ["WaitingForResources", "Executing", "Restarting", "WaitingForResources", "Finished"]


def test_errors_reading_spark_do_not_stop_the_polling_until_they_persist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from keyflow.runtime import autoscale

    monkeypatch.setattr(autoscale, "POLL_SECONDS", 0.01)
    reads = {"count": 0, "fail_from": 5}

    def slots() -> tuple[int, frozenset[str]]:
        reads["count"] += 1
        if reads["count"] == 2 or reads["count"] >= reads["fail_from"]:
            raise RuntimeError("py4j: connection reset")
        return 2, frozenset({"0", "1"})

    config = SchedulerConfig(max_parallelism=8, resource_stabilization_timeout=0)
    autoscaler = Autoscaler(AdaptiveScheduler(config, FakeClock()), slots, Checkpoint(str(tmp_path / "c")), "r")
    failed: list[Exception] = []
    done = threading.Event()
    autoscaler.scheduler.start()
    autoscaler.start_polling(lambda error: (failed.append(error), done.set()))
    assert done.wait(10)
    assert reads["count"] == reads["fail_from"] - 1 + autoscale.FAILED_POLLS  # one error was survived
    assert autoscaler.scheduler.state is State.EXECUTING  # the reads between the errors counted
    assert "cannot read Spark's executors: py4j: connection reset" in str(failed[0])
    autoscaler.close("failed", failed[0])
