"""A pre-keyed log: clicks already partitioned by user outside keyflow, aggregated with no shuffle.

The log stands in for a Kafka topic keyed by user: its writer puts every user in one of 8
splits with its own partitioner (CRC-32 of the name, not keyflow's hash). keyflow reads it
with ``reinterpret_as_keyed("user")``: each split is mapped to a key group of its own, subtask
``i`` reads the splits of its key groups, and the keyed operators run right there: no
exchange between the source and the state. A user in two splits would stop the job
(``pipeline.pre-keyed.verify``).

Run it with::

    keyflow run examples/pre_keyed.py --checkpoint ckpt/pre_keyed --available-now
    keyflow run examples/pre_keyed.py --checkpoint ckpt/pre_keyed --available-now -p 3   # rescaled

The first load writes 200,000 clicks to ``data/pre_keyed_clicks``; ``python
examples/pre_keyed.py`` appends 200,000 more (run the pipeline again to read them). Outputs
are Parquet directories under ``out/pre_keyed/``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from keyflow import KeyedBatch, KeyedState, Log, Pipeline, ValueState, log, parquet

LOG, OUT, SPLITS = "data/pre_keyed_clicks", "out/pre_keyed", 8
SCHEMA = pa.schema([("user", pa.string()), ("price", pa.float64()), ("seq", pa.int64())])


def append_clicks(path: str, rows: int = 200_000, users: int = 5_000) -> None:
    """Append clicks, each user to split ``crc32(user) % 8``: the outside world's partitioner."""
    target = Log(path) if Path(path, "_log.json").exists() else Log.create(path, SPLITS, SCHEMA)
    first = sum(target.end_offsets())
    rng = np.random.default_rng(first)
    names = np.array([f"user-{n}" for n in range(users)])
    picked = rng.zipf(1.3, rows) % users
    split_of_user = np.array([zlib.crc32(name.encode()) % SPLITS for name in names])
    clicks = pa.table(
        {"user": names[picked], "price": np.round(rng.uniform(1, 100, rows), 2), "seq": np.arange(first, first + rows)}
    )
    for split in range(SPLITS):
        target.append(clicks.filter(pa.array(split_of_user[picked] == split)), split=split)


def running_spend(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each click with the user's spend so far; the total carries over micro-batches in state."""
    spend = state["spend"]
    running = batch.running_sum(batch.data.column("price"), initial=spend.get())
    spend.update(batch.last_per_key(running))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "spend": running})


if not Path(LOG, "_log.json").exists():
    append_clicks(LOG)
pipeline = Pipeline(config={"pipeline.name": "pre_keyed", "parallelism.default": 2})
clicks = pipeline.source(log(LOG, rows_per_batch=100_000)).reinterpret_as_keyed("user")
clicks.aggregate(clicks="count(*)", revenue="sum(price)").set_name("per_user").sink(parquet(f"{OUT}/per_user"))
clicks.process(
    running_spend, schema="user string, seq long, spend double", state={"spend": ValueState("float64")}, order_by="seq"
).sink(parquet(f"{OUT}/running_spend"))

if __name__ == "__main__":
    append_clicks(LOG)
    print(f"{LOG}: {sum(Log(LOG).end_offsets()):,} clicks in {SPLITS} splits")
