"""A streaming job on a multi-host Spark standalone cluster, with hosts failing.

Seven hosts, each a network namespace with its own address on a private switch
(``tests/hosts.py``): the object store (an S3 server holding the checkpoint), the Spark
master, three worker hosts and the driver. The job runs the running totals of the
single-machine tests under the adaptive scheduler while the test kills a worker host's
processes mid-batch, cuts another from the network for longer than Spark's timeouts, stalls
the store during commits, kills the driver while the store is stalled and restarts it, and
brings a worker host back. The output then equals pandas' answer: every event once.

The hosts share this machine's filesystem: the log the job reads and the files its sink
writes are on it (as on an NFS share); the checkpoint is only on the store host.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.hosts import Host, Network
from tests.streams import append, events, expected_totals, read_output

pytestmark = pytest.mark.jvm

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "s3://checkpoints/totals"
WORKER_TIMEOUT = 5  # seconds without a heartbeat before the master drops a worker (Spark's default: 60)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "keyflow-test", "AWS_SECRET_ACCESS_KEY": "keyflow-test-secret",
               "AWS_REGION": "us-east-1"}  # fmt: skip
CREATE_BUCKET = """
import sys
from pyarrow import fs
host = sys.argv[1].removeprefix("http://")
fs.S3FileSystem(endpoint_override=host, scheme="http", allow_bucket_creation=True).create_dir("checkpoints")
"""
READ_CHECKPOINT = """
import json, sys
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.inspect import scheduler_log
checkpoint = Checkpoint(sys.argv[1])
print(json.dumps({"events": checkpoint.events(), "scheduler": scheduler_log(checkpoint),
                  "versions": checkpoint.manifests.versions()}))
"""


class Appender(threading.Thread):
    """Appends 100 events every 0.3 s to the log, as a live source would."""

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log, self.written, self.stopped = log, list[pd.DataFrame](), threading.Event()

    def run(self) -> None:
        seq = 0
        while not self.stopped.wait(0.3):
            chunk = events(100, 60, start=seq, seed=seq)
            append(self.log, chunk)
            self.written.append(chunk)
            seq += len(chunk)

    def all(self) -> pd.DataFrame:
        self.stopped.set()
        self.join()
        return pd.concat(self.written, ignore_index=True)


def run_on(host: Host, directory: Path, name: str, *argv: str, env: dict[str, str] | None = None) -> str:
    """Run a command on ``host`` to its end; its output."""
    log = directory / f"{name}.out"
    process = host.popen(argv, env=env, log=log, cwd=ROOT)
    assert process.wait(timeout=120) == 0, log.read_text()
    return log.read_text()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with Network() as network:
        hosts = {name: network.add_host(name) for name in ("store", "master", "worker-1", "worker-2", "worker-3",
                                                           "driver")}  # fmt: skip
        endpoint = hosts["store"].start_s3(tmp_path / "store")
        url = hosts["master"].start_spark_master(tmp_path / "master", WORKER_TIMEOUT)
        for name in ("worker-2", "worker-3"):  # worker-1 joins later
            hosts[name].start_spark_worker(url, tmp_path / name, worker_timeout_s=WORKER_TIMEOUT)
        s3 = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
        run_on(hosts["driver"], tmp_path, "bucket", sys.executable, "-c", CREATE_BUCKET, endpoint, env=s3)
        yield {"hosts": hosts, "endpoint": endpoint, "url": url}


def test_exactly_once_through_lost_joining_and_cut_hosts_a_stalled_store_and_a_killed_driver(
    tmp_path: Path, cluster: dict[str, Any]
) -> None:
    hosts: dict[str, Host] = cluster["hosts"]
    driver, store = hosts["driver"], hosts["store"]
    env = {**CREDENTIALS, "KEYFLOW_TEST_DIR": str(tmp_path), "KEYFLOW_TEST_MASTER": cluster["url"],
           "KEYFLOW_TEST_DRIVER_HOST": driver.address, "PYTHONPATH": str(ROOT)}  # fmt: skip
    command = [sys.executable, "-m", "keyflow", "run", "tests/jobs/cluster_totals.py", "--checkpoint", CHECKPOINT,
               "--conf", f"s3.endpoint={cluster['endpoint']}"]  # fmt: skip
    append(tmp_path / "log", events(100, 60, start=10**9, seed=1).iloc[:0])  # an empty log to start from
    appender = Appender(tmp_path / "log")
    appender.start()
    job = driver.popen(command, env=env, log=tmp_path / "job-1.out", cwd=ROOT)

    def committed() -> int:
        return len(read_output(tmp_path / "out"))

    def progress(what: str) -> None:
        """Wait for the sink to grow by a few committed micro-batches."""
        start = committed()
        wait_for(what, lambda: committed() >= start + 400, job)

    def rescaled(before: int, after: int, times: int = 1) -> None:
        """Wait for the ``times``-th change from ``before`` to ``after`` (batch lines of the job)."""
        changes = lambda: rescales(tmp_path / "job-1.out").count((before, after))  # noqa: E731
        wait_for(f"rescale {before} → {after} number {times}", lambda: changes() >= times, job)

    try:
        progress("micro-batches on worker-2 and worker-3")
        hosts["worker-3"].kill()  # mid-batch: its worker, executor and Python workers die at once
        rescaled(2, 1)  # the adaptive scheduler after resource-stabilization-timeout
        hosts["worker-1"].start_spark_worker(cluster["url"], tmp_path / "worker-1", worker_timeout_s=WORKER_TIMEOUT)
        rescaled(1, 2)  # (a rescale shows in the first micro-batch committed at the new parallelism)
        hosts["worker-2"].disconnect()  # longer than the master's worker timeout (5 s): declared lost
        rescaled(2, 1, times=2)
        hosts["worker-2"].reconnect()  # it registers again and gets an executor
        rescaled(1, 2, times=2)
        store.pause()  # the store stalls while micro-batches run: they wait for it ...
        time.sleep(3)
        driver.kill()  # ... and the driver host dies meanwhile
        store.resume()
        job = driver.popen(command, env=env, log=tmp_path / "job-2.out", cwd=ROOT)
        progress("micro-batches after the driver restarted")
        data = appender.all()
        wait_for("every event in the output", lambda: committed() >= len(data), job)
        for name in ("worker-1", "worker-2"):  # the last hosts leave: resource-wait-timeout (5 s) fails the job
            hosts[name].kill()
        assert job.wait(timeout=90) == 2  # keyflow's error exit
    finally:
        appender.stopped.set()
        for name in ("job-1", "job-2"):
            log = tmp_path / f"{name}.out"
            print(f"--- {name}\n" + (log.read_text(errors="replace")[-4000:] if log.exists() else "(none)"))

    assert "no executor cores when the resource-wait-timeout (5 s" in (tmp_path / "job-2.out").read_text()
    master = (tmp_path / "master" / "master.out").read_text()  # the faults happened as meant:
    assert re.search(rf"Removing worker worker-\S+-{re.escape(hosts['worker-3'].address)}-\d+ on", master)
    cut = re.escape(hosts["worker-2"].address)
    assert re.search(rf"Removing worker-\S+-{cut}-\d+ because we got no heartbeat", master)  # cut off, not killed
    got = read_output(tmp_path / "out").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(data).reset_index(drop=True), check_dtype=False)
    state = json.loads(run_on(driver, tmp_path, "inspect", sys.executable, "-c", READ_CHECKPOINT, CHECKPOINT,
                              env={**CREDENTIALS, "AWS_ENDPOINT_URL": cluster["endpoint"]}))  # fmt: skip
    history = [(event["from"], event["to"]) for event in state["events"]]
    assert history == [(2, 1), (1, 2), (2, 1), (1, 2)], history  # the restart resumed at 2: no rescale
    decisions = [r for r in state["scheduler"] if r["kind"] == "decision"]
    assert [r["state"] for r in decisions][-3:] == ["Restarting", "WaitingForResources", "Finished"]


def rescales(job_log: Path) -> list[tuple[int, int]]:
    """The parallelism changes between the micro-batches the job printed, in order."""
    text = job_log.read_text(errors="replace") if job_log.exists() else ""
    runs = [int(p) for p in re.findall(r"^batch \d+: parallelism (\d+)", text, re.MULTILINE)]
    return [(a, b) for a, b in itertools.pairwise(runs) if a != b]


def wait_for(what: str, found: Callable[[], bool], job: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        if job.poll() is not None:
            raise AssertionError(f"the job ended (exit {job.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.5)
