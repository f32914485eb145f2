"""Write a history of orders to an upsert log: inserts, updates and deletes by ``order_id``.

    .venv/bin/python examples/orders_log.py data/orders   # then: keyflow sql examples/orders.sql ...

Each run appends ``--batches`` more changes, so a running stream sees new data arrive.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from keyflow import Log

SCHEMA = pa.schema([("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.float64())])


def changes(seed: int, rows: int = 5_000, orders: int = 2_000, users: int = 50) -> pa.Table:
    """Upserts of random orders; one in ten is a delete (its non-key columns all null)."""
    rng = np.random.default_rng(seed)
    order_id = rng.integers(0, orders, rows)
    user_id = np.char.add("user-", (order_id % users).astype(str))
    amount = np.round(rng.uniform(1, 500, rows), 2)
    delete = rng.random(rows) < 0.1
    return pa.table(
        {
            "order_id": order_id,
            "user_id": pa.array(user_id.tolist(), mask=delete),
            "amount": pa.array(amount, mask=delete),
        }
    )


def main(path: str, batches: int = 3, seed: int = 7) -> None:
    try:
        target = Log(path)
    except Exception:
        target = Log.create(path, 4, SCHEMA)
    first = sum(target.end_offsets())
    for batch in range(batches):
        target.append(changes(seed + first + batch), key="order_id")
    print(f"{path}: {sum(target.end_offsets()):,} changes in {target.splits} splits")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/orders")
