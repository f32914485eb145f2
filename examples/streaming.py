"""Streaming clicks: running per-user totals with durable, rescalable keyed state.

Click events are generated at ``rows_per_second`` (500,000 in all) and processed in
micro-batches; each micro-batch is an exactly-once checkpoint:

- ``per_user``: running clicks and revenue per user (a streaming aggregate: each batch
  writes the users it changed, with their totals so far);
- ``running_spend``: each click with the user's running spend, from value state.

Run it with::

    keyflow run examples/streaming.py --checkpoint ckpt/streaming --available-now
    keyflow checkpoints ckpt/streaming

Without ``--available-now`` it generates 100,000 clicks a second until 500,000; stop it
with Ctrl-C and start it again with ``-p 3``: it continues after the last committed
micro-batch at parallelism 3, reading its state by key-group range.

Outputs are Parquet directories under ``out/streaming/``.
"""

from __future__ import annotations

import pyarrow as pa

from keyflow import KeyedBatch, KeyedState, Pipeline, ValueState, datagen, parquet, random_float, sequence, zipf

OUT = "out/streaming"

pipeline = Pipeline(config={"pipeline.name": "streaming", "parallelism.default": 2})

clicks = pipeline.source(
    datagen(
        rows=500_000,
        rows_per_second=100_000,
        rows_per_batch=100_000,
        fields={"user": zipf(20_000, prefix="user-"), "price": random_float(0.0, 100.0), "seq": sequence()},
        seed=7,
    )
)

clicks.key_by("user").aggregate(clicks="count(*)", revenue="sum(price)").set_name("per_user").sink(
    parquet(f"{OUT}/per_user")
)


def running_spend(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Each click with the user's spend so far; the total carries over micro-batches in state."""
    spend = state["spend"]
    running = batch.running_sum(batch.data.column("price"), initial=spend.get())
    spend.update(batch.last_per_key(running))
    return pa.table({"user": batch.data.column("user"), "seq": batch.data.column("seq"), "spend": running})


clicks.key_by("user").process(
    running_spend, schema="user string, seq long, spend double", state={"spend": ValueState("float64")}, order_by="seq"
).sink(parquet(f"{OUT}/running_spend"))

if __name__ == "__main__":
    pipeline.run(checkpoint="ckpt/streaming", available_now=True)
