"""Checkpoints on an S3-compatible store against checkpoints on local disk, same job, same data.

The store is moto in server mode on loopback (``tests/s3_server.py``), an in-memory Python
server: its requests cost a few milliseconds where AWS S3's cost 10-30 ms, so these figures
show keyflow's own cost of an object store (requests per micro-batch, no listings), not S3's
latency. The job: a streaming running count and sum per key (``--keys`` keys) over
``--files`` Parquet files of ``--rows`` rows, one file per micro-batch, at parallelism 4.

1. Micro-batch time with the state on the store vs on local disk: median of the steady
   batches (all but the first), best and median of ``--runs`` runs (peer: the same keyflow job
   with a local checkpoint).
2. Restore after a host loss: one more file, run by a new job (as every run, it takes Spark's
   source log from the checkpoint into a working copy of its own, as a driver on another host
   would): seconds from start to its first commit (peer: the same restart from a local checkpoint).
3. Bytes each subtask reads when the parallelism changes 4 → 3 and 4 → 6: the state files a
   subtask's restore opens from the store, measured at the filesystem, against its share
   of the version's state bytes (its key groups / K). Files are whole-range files, so a
   subtask whose range straddles two old ranges reads both files whole.

Run ``.venv/bin/python -m bench.object_store`` (defaults: 8 files x 200,000 rows, 200,000 keys).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.report import emit, emit_best_and_median, progress
from keyflow import Pipeline, blackhole, files
from keyflow.keygroups import key_group_range
from keyflow.runtime.streaming import BatchMetrics
from keyflow.state.assignment import files_to_read
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.state_files import read_range
from tests.filesystems import CountingFiles
from tests.s3_server import S3Server

BENCH = "object_store"
PARALLELISM = 4


def write_batches(directory: Path, count: int, rows: int, keys: int, first: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(first)
    for number in range(first, first + count):
        table = pa.table({"k": pa.array(rng.integers(0, keys, rows), pa.int64()), "v": rng.uniform(0, 100, rows)})
        pq.write_table(table, directory / f"batch-{number:04d}.parquet")


def run(
    data: Path, checkpoint: str, store: S3Server, on_batch: Callable[[BatchMetrics], None] | None = None
) -> list[BatchMetrics]:
    pipeline = Pipeline(
        parallelism=PARALLELISM,
        config={"spark.master": f"local[{PARALLELISM}]", "pipeline.progress": "off",
                "execution.checkpointing.interval": "0 s", **store.config()},
    )  # fmt: skip
    source = files(data, schema="k long, v double", watch=True, maxFilesPerTrigger="1")
    pipeline.source(source).key_by("k").aggregate(n="count(*)", s="sum(v)").sink(blackhole())
    return pipeline.run(checkpoint=checkpoint, available_now=True, on_batch=on_batch).batches


def bytes_per_subtask(uri: str, parallelism: int) -> list[tuple[int, int, int]]:
    """For each subtask at ``parallelism``: (bytes its restore reads from the store, measured at
    the filesystem, its share of the version's state bytes, its key groups); the files are
    those a restore of its range reads (``files_to_read``), each read as the restore reads it."""
    checkpoint = Checkpoint(uri)
    manifest = checkpoint.manifests.latest()
    assert manifest is not None
    (state_files,) = manifest.operators.values()
    total = sum(f.bytes for f in state_files)
    found = []
    for subtask in range(parallelism):
        first, last = key_group_range(manifest.max_parallelism, parallelism, subtask)
        counting = CountingFiles(checkpoint.fs)
        checkpoint.fs = counting
        for f in files_to_read(state_files, first, last):
            read_range(checkpoint, f, first, last)
        checkpoint.fs = counting.inner
        groups = last - first + 1
        found.append((counting.read, round(total * groups / manifest.max_parallelism), groups))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-store-"))
    store = S3Server(work / "s3")
    try:
        bucket = store.bucket("bench")
        steady: dict[str, list[float]] = {"s3": [], "local": []}
        restores: dict[str, list[float]] = {"s3": [], "local": []}
        last_s3 = ""
        for number in range(args.runs):
            for where, uri in (("s3", f"{bucket}/run-{number}"), ("local", str(work / f"local-{number}"))):
                progress(f"run {number + 1}/{args.runs}, checkpoint on {where}")
                data = work / f"data-{where}-{number}"
                write_batches(data, args.files, args.rows, args.keys)
                batches = run(data, uri, store)
                steady[where].append(statistics.median(b.seconds for b in batches[1:]))
                write_batches(data, 1, args.rows, args.keys, first=args.files)
                committed: list[float] = []
                started = time.perf_counter()
                run(data, uri, store, on_batch=lambda _, into=committed: into.append(time.perf_counter()))
                restores[where].append(committed[0] - started)
            last_s3 = f"{bucket}/run-{number}"
        emit_best_and_median(BENCH, f"micro-batch time, state on S3 (moto), {args.keys:,} keys", "s", steady["s3"],
                             "keyflow, state on local disk", steady["local"])  # fmt: skip
        emit_best_and_median(BENCH, "restart on a new host: start to first commit, state on S3", "s", restores["s3"],
                             "keyflow, restart from local disk", restores["local"])  # fmt: skip
        for parallelism in (3, 6):
            for subtask, (read, share, groups) in enumerate(bytes_per_subtask(last_s3, parallelism)):
                emit(BENCH, f"bytes read restoring subtask {subtask} of {parallelism} ({groups} key groups) "
                     f"from state written at {PARALLELISM}", "bytes", read, "its key groups' share of the state",
                     share)  # fmt: skip
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
