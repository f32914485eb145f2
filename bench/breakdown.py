"""Where the seconds of a keyed ``process`` go: the same 20M generated rows through growing
prefixes of its Spark plan, each timed alone (best of ``--repeats``), then keyflow's Python work
in one worker with no Spark around it.

Pieces (each line includes the ones before it):
1. ``source``: generating the rows (datagen) into Spark's ``noop`` writer;
2. ``+ keyed exchange``: keyflow's exact exchange by key group (Spark's shuffle);
3. ``+ sort by key``: what ``order_by`` needs (Spark's sort within partitions);
4. ``+ Arrow round trip``: the rows to a Python worker and back, untouched (``mapInArrow``);
5. ``keyflow process``: the whole operator with ``order_by`` and without it.
Then ``worker python``: ``KeyedRunner`` over 10M rows (one worker's share) fed as Arrow
batches in-process, sorted by key (``order_by``) or not, at Spark's default batch size (10,000
rows) and at keyflow's (100,000).

Run: ``.venv/bin/python -m bench.breakdown [--rows N] [--keys N] [--repeats N]`` (peer: none;
these are the figures docs/benchmarks.md's profile summary quotes).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from bench.batch_keyed import keyflow_pipeline, noop, running_spend, source
from bench.report import best_seconds, emit, progress
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.plan.descriptors import ValueState
from keyflow.runtime.exchange import keyed_exchange
from keyflow.runtime.session import spark_session
from keyflow.runtime.workers import KeyedRunner, KeyedTask, UserProcess
from keyflow.state.durable import MemoryState


def untouched(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def spark_pieces(args: argparse.Namespace) -> None:
    spark = spark_session({"spark.master": f"local[{args.parallelism}]"}, app_name="keyflow-breakdown")
    keyflow_pipeline(100_000, 1_000, args.parallelism, "process").run()  # warm-up; sets keyflow's session defaults
    rows = lambda: source(args.rows, args.keys).read(spark, args.parallelism)  # noqa: E731
    exchanged = lambda: keyed_exchange(rows(), ("user",), 27720, args.parallelism)  # noqa: E731
    schema = exchanged().schema
    pieces = {
        "source": lambda: noop(rows()),
        "+ keyed exchange": lambda: noop(exchanged()),
        "+ sort by key": lambda: noop(exchanged().sortWithinPartitions("user")),
        "+ Arrow round trip": lambda: noop(exchanged().sortWithinPartitions("user").mapInArrow(untouched, schema)),
        "keyflow process, order_by": keyflow_pipeline(args.rows, args.keys, args.parallelism, "process").run,
        "keyed exchange + Arrow round trip (no sort)": lambda: noop(exchanged().mapInArrow(untouched, schema)),
        "keyflow process, arrival order": keyflow_pipeline(args.rows, args.keys, args.parallelism, "arrival").run,
    }
    for name, run in pieces.items():
        progress(name)
        seconds = best_seconds(run, args.repeats)
        emit("breakdown", f"{name}: {args.rows} rows, {args.keys} keys", "s", seconds, None, None)


def worker_python(args: argparse.Namespace) -> None:
    rows = args.rows // args.parallelism
    rng = np.random.default_rng(1)
    users = rng.integers(1, args.keys + 1, rows)
    for ordered in (True, False):
        keys = np.sort(users) if ordered else users
        table = pa.table(
            {
                "user": keys,
                "price": rng.random(rows),
                "n": rng.permutation(rows).astype(np.int64),
                KEY_GROUP_COLUMN: (keys % 13860).astype(np.int32),
            }
        )
        for batch_rows in (10_000, 100_000):
            task = KeyedTask(
                "process", pa.schema([("user", pa.int64()), ("n", pa.int64()), ("running", pa.float64())]),
                ("user",), {"spend": ValueState("float64")}, 27720, 1, MemoryState(), ("n",) if ordered else (),
                verify=False,
            )  # fmt: skip
            runner = KeyedRunner(UserProcess(running_spend, "process"), task)
            batches = table.to_batches(max_chunksize=batch_rows)
            seconds = best_seconds(lambda: sum(b.num_rows for b in runner(iter(batches))), args.repeats)  # noqa: B023
            how = "order_by (input sorted by key)" if ordered else "arrival order (hash grouping)"
            emit("breakdown", f"worker python, {how}, {rows} rows, {batch_rows}-row batches", "s", seconds, None,
                 None)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    spark_pieces(args)
    worker_python(args)


if __name__ == "__main__":
    main()
