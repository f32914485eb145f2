"""Clickstream: per-user and per-page aggregates and a running spend per user.

Generated click events (user, page, price, time) with Zipf-skewed users, as a batch job:

- ``per_user``: clicks and revenue per user (keyed aggregate);
- ``per_page``: clicks, revenue and average price per page (keyed aggregate);
- ``running_spend``: each click with the user's running spend so far and the time the
  user was first seen, from per-user value state in a keyed ``process`` function.

Run it with ``make demo`` or ``keyflow run examples/clickstream.py [--conf key=value]``.
Outputs are Parquet directories under ``out/clickstream/``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from keyflow import (
    KeyedBatch,
    KeyedState,
    Pipeline,
    ValueState,
    choice,
    datagen,
    parquet,
    random_float,
    timestamp,
    zipf,
)

OUT = "out/clickstream"

pipeline = Pipeline(config={"pipeline.name": "clickstream", "parallelism.default": 2})

clicks = pipeline.source(
    datagen(
        rows=500_000,
        fields={
            "user": zipf(50_000, exponent=1.1, prefix="user-"),
            "page": choice(["home", "search", "product", "cart", "checkout", "help"]),
            "price": random_float(-5.0, 120.0),
            "ts": timestamp(start="2026-11-01 00:00:00", step_ms=250),
        },
        seed=7,
    ),
    parallelism=1,
)
paid = clicks.filter("price > 0")

paid.key_by("user").aggregate(clicks="count(*)", revenue="sum(price)").sink(parquet(f"{OUT}/per_user"))
paid.key_by("page").aggregate(clicks="count(*)", revenue="sum(price)", avg_price="avg(price)").sink(
    parquet(f"{OUT}/per_page")
)


def running_spend(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Running spend per user over time, continuing from the user's state.

    Rows arrive sorted by user, then time; a user's rows may continue in the next batch,
    so the spend so far and the first-seen time live in value state.
    """
    spend, first_seen = state["spend"], state["first_seen"]
    running = batch.running_sum(batch.data.column("price"), initial=spend.get())
    seen = pc.coalesce(first_seen.get(), batch.data.column("ts").take(pa.array(batch.starts)))
    spend.update(pa.array(batch.last_per_key(running)))
    first_seen.update(seen)
    return pa.table(
        {
            "user": batch.data.column("user"),
            "ts": batch.data.column("ts"),
            "price": batch.data.column("price"),
            "running_spend": running,
            "first_seen": seen.take(pa.array(batch.key_index)),
        }
    )


paid.key_by("user").process(
    running_spend,
    schema="user string, ts timestamp, price double, running_spend double, first_seen timestamp",
    state={"spend": ValueState("float64"), "first_seen": ValueState("timestamp[us]")},
    order_by=["ts"],
).sink(parquet(f"{OUT}/running_spend"))


if __name__ == "__main__":
    for output in pipeline.run().sinks:
        print(f"{output.name}: {output.rows:,} rows")
