"""What routing a changelog source by primary key costs against rebalancing an insert-only one.

The same rows (order changes: ``order_id``, ``user_id``, ``amount``; one in ten a delete)
are appended to two logs: an insert-only log and an upsert log. Both are read at
``scan.parallelism`` 3 with the operators at parallelism 2 (FLIP-367's setting):

1. source -> sink: the insert-only rows are rebalanced (round robin, no state); the upsert
   rows are routed by ``order_id``'s key group to ChangelogNormalize, which keeps each
   order's last row as keyed state and emits -U/+U/-D.
2. source -> ``GROUP BY user_id`` (count, sum, max): the insert-only stream is aggregated;
   the upsert stream is normalized, then aggregated with retraction.

Metric: rows/s over the steady micro-batches (all but the first), best and median of 3
runs, each on a fresh checkpoint. Both sides are keyflow streaming jobs ending in
``blackhole``; the peer is the insert-only/rebalance job on the same rows. Run
``.venv/bin/python -m bench.changelog_routing`` (defaults: 1.2M changes, 200k orders,
4 micro-batches of 300k).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.report import emit, progress
from keyflow import Log, Pipeline

SCHEMA = pa.schema([("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.float64())])


def write_logs(work: Path, rows: int, orders: int, batch: int) -> None:
    rng = np.random.default_rng(1)
    logs = [Log.create(work / name, 4, SCHEMA) for name in ("insert", "upsert")]
    for start in range(0, rows, batch):
        size = min(batch, rows - start)
        deleted = rng.random(size) < 0.1
        order_id = rng.integers(0, orders, size)
        table = pa.table(
            {
                "order_id": order_id,
                "user_id": pa.array([f"user-{n}" for n in order_id % 5_000], mask=deleted),
                "amount": pa.array(np.round(rng.uniform(1, 500, size), 2), mask=deleted),
            }
        )
        for target in logs:
            target.append(table, key="order_id")


def script(work: Path, log: str, per_batch: int, aggregate: bool) -> str:
    connector = "'upsert-log'" if log == "upsert" else "'log'"
    key = ", PRIMARY KEY (order_id) NOT ENFORCED" if log == "upsert" else ""
    query = (
        "SELECT user_id, COUNT(*), SUM(amount), MAX(amount) FROM orders WHERE user_id IS NOT NULL GROUP BY user_id"
        if aggregate
        else "SELECT order_id, user_id, amount FROM orders"
    )
    columns = "user_id STRING, n BIGINT, total DOUBLE, top DOUBLE" if aggregate else (
        "order_id BIGINT, user_id STRING, amount DOUBLE")  # fmt: skip
    return f"""
        CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE{key})
        WITH ('connector' = {connector}, 'path' = '{work / log}', 'scan.parallelism' = '3',
              'scan.rows-per-batch' = '{per_batch}');
        CREATE TABLE out ({columns}) WITH ('connector' = 'blackhole');
        INSERT INTO out {query};
    """


def steady_rate(work: Path, log: str, args: argparse.Namespace, aggregate: bool, run: int) -> float:
    config = {
        "spark.master": "local[2]",
        "pipeline.progress": "off",
        "parallelism.default": 2,
        "execution.checkpointing.interval": "0 s",
    }
    pipeline = Pipeline(config=config)
    pipeline.sql(script(work, log, args.batch, aggregate))
    checkpoint = work / f"ckpt-{log}-{aggregate}-{run}"
    batches = pipeline.run(checkpoint=str(checkpoint), available_now=True).batches
    shutil.rmtree(checkpoint, ignore_errors=True)
    steady = [b for b in batches[1:] if b.input_rows]
    return sum(b.input_rows or 0 for b in steady) / sum(b.seconds for b in steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-changelog-"))
    try:
        write_logs(work, args.rows, args.orders, args.batch)
        progress("warm-up")
        steady_rate(work, "insert", argparse.Namespace(**{**vars(args), "batch": args.rows // 4}), False, -1)
        for aggregate, label in ((False, "source -> sink"), (True, "source -> GROUP BY user_id")):
            rates: dict[str, list[float]] = {"insert": [], "upsert": []}
            for run in range(args.runs):
                for log in ("insert", "upsert"):
                    rates[log].append(steady_rate(work, log, args, aggregate, run))
                    progress(f"{label}, {log} log, run {run}: {rates[log][-1]:,.0f} rows/s")
            for statistic, pick in (("best", max), ("median", statistics.median)):
                emit(
                    "changelog_routing",
                    f"{label}: upsert source routed by primary key + normalized, {args.rows} changes, "
                    f"scan.parallelism 3 -> 2 ({statistic} of {args.runs})",
                    "rows/s",
                    pick(rates["upsert"]),
                    "the same rows from an insert-only log, rebalanced",
                    pick(rates["insert"]),
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
