"""Autoscaling: a stateful streaming pipeline follows the executors it has, with a cooldown.

This script starts a small Spark standalone cluster on this machine (a master and one
1-core worker, from the PySpark distribution), runs running per-user totals on it with
``jobmanager.scheduler=adaptive``, then:

1. adds a second worker during the cooldown → when the cooldown (``scaling-interval.min`` =
   20 s after the job started) is over, its check restarts the job (Flink's rule: the new
   slot waits for that check, it does not move it), which runs at 2 after
   ``resource-stabilization-timeout`` (5 s);
2. stops the first worker (a lost node) → Restarting → WaitingForResources → 2 → 1 after
   ``resource-stabilization-timeout`` (5 s) of stable slots;
3. stops, checks the totals against the generated clicks (no state lost), and draws the
   scheduler's timeline.

Run it (about 2 minutes)::

    .venv/bin/python examples/autoscale.py
    keyflow timeline ckpt/autoscale          # the decisions as a table

Outputs: ``out/autoscale/totals`` (Parquet), ``out/autoscale/timeline.png``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from keyflow import KeyedBatch, KeyedState, Pipeline, ValueState, datagen, parquet, sequence, zipf
from keyflow.cli.timeline import draw
from keyflow.runtime.standalone import StandaloneCluster
from keyflow.runtime.streaming import StreamingJob
from keyflow.scheduler.timeline import timeline
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.inspect import scheduler_log

OUT, CHECKPOINT = Path("out/autoscale").resolve(), Path("ckpt/autoscale").resolve()


def running_clicks(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each click with the user's click count so far (value state, carried over batches)."""
    clicks = state["clicks"]
    ones = pa.array([1] * batch.data.num_rows, pa.int64())
    running = batch.running_sum(ones, initial=clicks.get())
    clicks.update(batch.last_per_key(running))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "clicks": running})


def build(master: str) -> Pipeline:
    pipeline = Pipeline(
        config={
            "pipeline.name": "autoscale",
            "spark.master": master,
            "spark.driver.host": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.ui.enabled": "false",
            "execution.checkpointing.interval": "1 s",
            "jobmanager.scheduler": "adaptive",
            "jobmanager.adaptive-scheduler.scaling-interval.min": "20 s",
            "jobmanager.adaptive-scheduler.resource-stabilization-timeout": "5 s",
        }
    )
    clicks = pipeline.source(
        datagen(rows_per_second=2_000, fields={"user": zipf(500, prefix="user-"), "seq": sequence()}, seed=3)
    )
    clicks.key_by("user").process(
        running_clicks, schema="user string, seq long, clicks long", state={"clicks": ValueState("int64")},
        order_by="seq",
    ).sink(parquet(str(OUT / "totals")))  # fmt: skip
    return pipeline


def wait_for(job: StreamingJob, what: str, check: Callable[[], bool]) -> None:
    while not check():
        if job.status != "running":
            raise SystemExit(f"the job stopped while waiting for {what}")
        time.sleep(1)
    print(f"  {what}: parallelism {job.parallelism}, scheduler {job.scheduler_state}")


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    shutil.rmtree(CHECKPOINT, ignore_errors=True)
    cluster = StandaloneCluster(Path(tempfile.mkdtemp(prefix="keyflow-cluster-")))
    try:
        cluster.add_worker("worker-1")
        print(f"cluster {cluster.url}: worker-1 (1 core); starting the job")
        job = build(cluster.url).start(checkpoint=str(CHECKPOINT))
        print(f"  running at parallelism {job.parallelism}")
        cluster.add_worker("worker-2")
        print("worker-2 (1 core) added during the cooldown")
        wait_for(job, "rescaled up after the cooldown", lambda: job.parallelism == 2)
        time.sleep(5)
        cluster.stop_worker("worker-1")
        print("worker-1 stopped")
        wait_for(job, "rescaled down after stabilization", lambda: job.parallelism == 1)
        time.sleep(5)
        job.stop()
    finally:
        cluster.close()

    totals = ds.dataset(OUT / "totals", format="parquet").to_table()
    final = totals.group_by("user").aggregate([("clicks", "max"), ("seq", "count")])
    assert pc.all(pc.equal(final["clicks_max"], final["seq_count"])).as_py(), "a running count skipped a click"
    assert pc.count_distinct(totals["seq"]).as_py() == totals.num_rows, "a click was counted twice"
    print(f"{totals.num_rows:,} clicks of {final.num_rows} users: every running count exact across both rescales")
    draw(timeline(scheduler_log(Checkpoint(str(CHECKPOINT)))), str(OUT / "timeline.png"), "examples/autoscale.py")
    print(f"timeline: {OUT / 'timeline.png'}; decisions: keyflow timeline {CHECKPOINT}")


if __name__ == "__main__":
    main()
