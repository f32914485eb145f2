"""Checkpoints on S3-compatible storage: a real S3 server (moto, on loopback) holds the state,
the manifests and Spark's source log; restarts, a killed driver whose disk is gone, a stalled
and a failing store each end with output equal to pandas' answer, exactly once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyarrow import fs

from keyflow import Pipeline, kafka_sink, log, parquet
from keyflow.errors import CheckpointError, ConfigError, ExternalSystemError, PlanError
from keyflow.s3 import ENVIRONMENT
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.manifests import Manifest
from tests.s3_server import LISTING, S3Server
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, append, config, events, expected_totals, read_output, running_total

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.close()


def totals_pipeline(tmp: Path, store: S3Server, parallelism: int, pre_keyed: bool = False, **extra: object) -> Pipeline:
    """Running totals of the log; ``pre_keyed``: read as keyed by user (the log is split by user),
    whose subtasks also report their keys for the driver to check."""
    pipeline = Pipeline(config={**config(parallelism), **store.config(**extra)})
    stream = pipeline.source(log(str(tmp / "log"), rows_per_batch=700))
    keyed = stream.reinterpret_as_keyed("user") if pre_keyed else stream.key_by("user")
    keyed.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(parquet(tmp / "out"))
    return pipeline


def assert_totals(tmp: Path, all_events: pd.DataFrame) -> None:
    got = read_output(tmp / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(all_events).reset_index(drop=True), check_dtype=False)


def objects(store: S3Server, uri: str) -> list[str]:
    root = uri.removeprefix("s3://")
    infos = store.filesystem().get_file_info(fs.FileSelector(root, recursive=True))
    return sorted(info.path[len(root) + 1 :] for info in infos if info.type == fs.FileType.File)


@pytest.mark.jvm
def test_state_on_s3_restarts_at_another_parallelism_and_lists_nothing_per_batch(
    spark, tmp_path: Path, store: S3Server
) -> None:
    """A pre-keyed pipeline: its subtasks report both their state files and their key reports
    (key_by pipelines on S3: the other tests here and tests/test_cluster_faults.py)."""
    checkpoint = f"{store.bucket('restart')}/jobs/totals"
    first = events(2_000, 150, start=0, seed=1)
    append(tmp_path / "log", first)
    result = totals_pipeline(tmp_path, store, 2, pre_keyed=True).run(checkpoint=checkpoint, available_now=True)
    assert len(result.batches) >= 2
    assert_totals(tmp_path, first)
    stored = objects(store, checkpoint)
    assert {"plan.json", "manifests/0000000000.json"} <= set(stored)
    assert any(path.startswith("source/offsets/") for path in stored)  # Spark's log, copied in
    assert any(path.startswith("state/") and path.endswith(".parquet") for path in stored)

    second = events(3_000, 150, start=2_000, seed=2)
    append(tmp_path / "log", second)
    listed_from: list[int] = []

    def mark(_: object) -> None:  # after the first micro-batch of the run: its restore is done
        if not listed_from:
            listed_from.append(len(store.requests()))

    result = totals_pipeline(tmp_path, store, 3, pre_keyed=True).run(checkpoint=checkpoint, available_now=True,
                                                                on_batch=mark)  # fmt: skip
    assert len(result.batches) >= 3
    assert_totals(tmp_path, pd.concat([first, second]))
    after_first = store.requests()[listed_from[0] :]
    assert after_first, "no request reached the store after the first micro-batch"
    assert [line for line in after_first if LISTING.search(line)] == []  # no listing per micro-batch
    assert [(e["from"], e["to"]) for e in Checkpoint(checkpoint).events()] == [(2, 3)]
    assert len(Checkpoint(checkpoint).manifests.versions()) == 3  # state.checkpoints.num-retained


@pytest.mark.jvm
def test_a_driver_killed_after_its_commit_resumes_on_another_disk(
    spark, tmp_path: Path, store: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL between keyflow's commit and Spark's; the restart takes Spark's source log from
    the checkpoint into a working copy of its own (every run does, as on another host), where
    the commit of the last batch is missing: Spark reruns it and keyflow skips it.
    The killed job reaches the store through the AWS SDK's environment variables alone."""
    for name in ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    checkpoint = f"{store.bucket('killed')}/ckpt"
    data = events(3_000, 100, start=0, seed=3)
    append(tmp_path / "log", data)
    env = {**os.environ, "KEYFLOW_TEST_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "KEYFLOW_FAULT": "after-commit:1"}
    job = subprocess.run(
        [sys.executable, "-m", "keyflow", "run", "tests/jobs/totals_on_s3.py", "--checkpoint", checkpoint],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert job.returncode == -9, job.stdout[-3000:] + job.stderr[-3000:]
    assert Checkpoint(checkpoint).manifests.versions()[-1] == 1
    totals_pipeline(tmp_path, store, 3).run(checkpoint=checkpoint, available_now=True)
    assert_totals(tmp_path, data)


@pytest.mark.jvm
def test_a_stalled_store_delays_the_commit_and_a_failed_one_resumes_exactly_once(
    spark, tmp_path: Path, store: S3Server
) -> None:
    checkpoint = f"{store.bucket('stalled')}/ckpt"
    batches = [events(1_000, 80, start=i * 1_000, seed=20 + i) for i in range(3)]
    options = {"s3.attempts.maximum": 1, "s3.connection.timeout": "3 s"}  # a try fails after 3 s without data
    append(tmp_path / "log", batches[0])
    job = totals_pipeline(tmp_path, store, 2, **options).start(checkpoint=checkpoint)
    try:
        job.process_all_available()
        store.pause()  # shorter than a request's timeout: the micro-batch waits, then commits
        threading.Timer(1.5, store.resume).start()
        append(tmp_path / "log", batches[1])
        job.process_all_available()
        assert_totals(tmp_path, pd.concat(batches[:2]))
        store.pause()  # longer than both tries: the micro-batch fails, nothing of it is committed
        append(tmp_path / "log", batches[2])
        with pytest.raises(ExternalSystemError) as failed:
            job.process_all_available()
    finally:
        store.resume()
        job.stop()
    message = str(failed.value)
    for named in (checkpoint, store.endpoint, "s3.attempts.maximum"):
        assert named in message
    assert_totals(tmp_path, pd.concat(batches[:2]))  # the failed batch published nothing
    totals_pipeline(tmp_path, store, 2, **options).run(checkpoint=checkpoint, available_now=True)
    assert_totals(tmp_path, pd.concat(batches))


def test_a_missing_bucket_and_an_unreachable_store_fail_before_spark_naming_them(
    tmp_path: Path, store: S3Server
) -> None:
    append(tmp_path / "log", events(10, 5, start=0, seed=4))
    with pytest.raises(ExternalSystemError) as missing:
        totals_pipeline(tmp_path, store, 2).start(checkpoint="s3://no-such-bucket/ckpt")
    assert "s3://no-such-bucket/ckpt" in str(missing.value)
    assert re.search(r"(?i)bucket.{0,40}(does not exist|not found)|NO_SUCH_BUCKET", str(missing.value))
    closed = {"s3.endpoint": "http://127.0.0.1:9", "s3.attempts.maximum": 2, "s3.connection.establish.timeout": "1 s"}
    with pytest.raises(ExternalSystemError) as unreachable:
        totals_pipeline(tmp_path, store, 2, **closed).start(checkpoint=f"{store.bucket('unreached')}/ckpt")
    assert "endpoint http://127.0.0.1:9" in str(unreachable.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"s3.endpoint": "ftp://store"}, "s3.endpoint='ftp://store' is not an endpoint"),
        ({"s3.connection.establish.timeout": "0 s"}, "s3.connection.establish.timeout='0 s' must be above 0"),
        ({"s3.attempts.maximum": -1}, "s3.attempts.maximum=-1 is invalid"),
        ({"s3.access-key": "key"}, "s3.access-key is set but s3.secret-key is not"),
    ],
)
def test_bad_s3_options_are_refused_naming_the_option(tmp_path: Path, options: dict[str, object], named: str) -> None:
    """Each is refused when the pipeline is built or started, before Spark or the store is reached."""

    def start() -> None:
        pipeline = Pipeline(config={**config(1), **options})
        pipeline.source(log(str(tmp_path / "log"))).sink(parquet(tmp_path / "out"))
        pipeline.start(checkpoint="s3://bucket/ckpt")

    append(tmp_path / "log", events(10, 5, start=0, seed=4))
    with pytest.raises(ConfigError, match=re.escape(named)):
        start()


def test_a_version_another_job_committed_is_refused_by_reading_not_listing(
    store: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    checkpoint = Checkpoint(f"{store.bucket('guard')}/ckpt")
    checkpoint.manifests.commit(Manifest(0, 1, 128, {}))
    listed = len([line for line in store.requests() if LISTING.search(line)])
    checkpoint.manifests.check_uncommitted(1)  # nobody committed 1
    with pytest.raises(CheckpointError, match="version 0 of checkpoint s3://guard/ckpt was committed by another job"):
        checkpoint.manifests.check_uncommitted(0)
    assert len([line for line in store.requests() if LISTING.search(line)]) == listed


def test_an_exactly_once_kafka_sink_with_a_checkpoint_on_s3_is_refused_before_spark(
    tmp_path: Path, store: S3Server
) -> None:
    append(tmp_path / "log", events(10, 5, start=0, seed=4))
    pipeline = Pipeline(config={**config(1), **store.config()})
    sink = kafka_sink("out", bootstrap_servers="127.0.0.1:9", delivery_guarantee="exactly-once",
                      transactional_id_prefix="t")  # fmt: skip
    pipeline.source(log(str(tmp_path / "log"))).sink(sink)
    with pytest.raises(PlanError, match=r"Kafka sink 'out' is exactly-once .* object store \(s3://kafka/ckpt\)"):
        pipeline.start(checkpoint=f"{store.bucket('kafka')}/ckpt")


def test_keyflow_plan_reports_s3_options_before_spark() -> None:
    from typer.testing import CliRunner

    from keyflow.cli.app import app

    example = str(ROOT / "examples" / "streaming.py")
    for conf, named in (("s3.access-key=key", "s3.access-key is set but s3.secret-key is not"),
                        ("s3.endpoint=ftp://store", "s3.endpoint='ftp://store' is not an endpoint")):  # fmt: skip
        result = CliRunner().invoke(app, ["plan", example, "--conf", conf])
        assert result.exit_code == 2, result.output
        assert named in result.output
