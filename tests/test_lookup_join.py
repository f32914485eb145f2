"""Lookup joins (``Stream.lookup_join``): a stream's rows enriched with a bounded table's, in a
batch run and in a streaming run that reads the table again as it runs (a file added to the
table between two runs is joined by the second); no state. The reference is pandas' merge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import Log, Pipeline, datagen, files, log, parquet, sequence
from keyflow.errors import PlanError
from tests.streams import append, config, read_output, write_files

ORDERS = pa.schema([("user", pa.string()), ("order_id", pa.int64()), ("amount", pa.int64())])
USERS = pa.schema([("uid", pa.string()), ("country", pa.string())])


def orders(rows: int, users: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    who = [f"u{n}" for n in rng.integers(0, users, rows)]
    return pd.DataFrame({"user": who, "order_id": np.arange(start, start + rows), "amount": rng.integers(1, 99, rows)})


def write_table(directory: Path, users: pd.DataFrame, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(users, schema=USERS, preserve_index=False), directory / name)


def expected(left: pd.DataFrame, table: pd.DataFrame, how: str) -> pd.DataFrame:
    joined = left.merge(table, left_on="user", right_on="uid", how=how)
    return tidy(joined[["user", "order_id", "amount", "country"]])


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype({"order_id": "int64", "amount": "int64"}).fillna({"country": "-"})
    return frame.sort_values(["order_id", "country"]).reset_index(drop=True)


@pytest.mark.jvm
def test_batch_and_streaming_lookup_joins_equal_pandas(tmp_path: Path) -> None:
    users = pd.DataFrame({"uid": [f"u{n}" for n in range(0, 30, 2)], "country": "de"})  # even users only
    write_table(tmp_path / "users", users, "part-0.parquet")
    batch = orders(300, 30, start=0, seed=1)
    write_files(tmp_path / "orders", batch, ORDERS)
    append(tmp_path / "log", batch, schema=ORDERS, key="user")
    p = Pipeline(config=config(2))
    table = p.source(files(str(tmp_path / "users")), name="users")
    for how in ("inner", "left"):
        joined = p.source(files(str(tmp_path / "orders"))).lookup_join(table, on=[("user", "uid")], how=how)
        joined.sink(parquet(tmp_path / "batch" / how))
    p.run()
    for how in ("inner", "left"):
        pd.testing.assert_frame_equal(tidy(read_output(tmp_path / "batch" / how)), expected(batch, users, how))

    def streaming() -> Pipeline:
        s = Pipeline(config=config(2))
        table = s.source(files(str(tmp_path / "users")), name="users")
        joined = s.source(log(str(tmp_path / "log")), uid="orders").lookup_join(table, on=[("user", "uid")], how="left")
        joined.sink(parquet(tmp_path / "stream"), uid="out")
        return s

    streaming().run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    odd = pd.DataFrame({"uid": [f"u{n}" for n in range(1, 30, 2)], "country": "fr"})
    write_table(tmp_path / "users", odd, "part-1.parquet")  # the table grows between micro-batches
    later = orders(200, 30, start=1_000, seed=2)
    append(tmp_path / "log", later, schema=ORDERS, key="user")
    streaming().run(checkpoint=str(tmp_path / "ckpt"), available_now=True)
    want = pd.concat([expected(batch, users, "left"), expected(later, pd.concat([users, odd]), "left")])
    pd.testing.assert_frame_equal(tidy(read_output(tmp_path / "stream")), tidy(want))
    assert (tidy(read_output(tmp_path / "stream")).country == "-").sum() == (batch.user.str[1:].astype(int) % 2).sum()


def test_lookup_join_mistakes_are_plan_errors(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 2, ORDERS)
    write_table(tmp_path / "users", pd.DataFrame({"uid": ["u1"], "country": ["de"]}), "part-0.parquet")
    p = Pipeline()
    stream = p.source(log(str(tmp_path / "log")), name="orders")
    table = p.source(files(str(tmp_path / "users"), schema="uid string, country string"), name="users")
    with pytest.raises(PlanError, match=r"how='right' is not a lookup join type; choose inner or left"):
        stream.lookup_join(table, on=[("user", "uid")], how="right")
    with pytest.raises(PlanError, match=r"the table \('orders'\) reads unbounded source\(s\) \['orders'\]"):
        table.lookup_join(stream, on=[("uid", "user")])
    known = p.source(datagen(rows=3, fields={"uid": sequence(), "order_id": sequence()}), name="numbers")
    with pytest.raises(PlanError, match=r"both streams have column\(s\) \['order_id'\] besides the keys"):
        stream.lookup_join(known, on=[("user", "uid")])
    counted = table.key_by("uid").aggregate(n="count(*)")
    with pytest.raises(PlanError, match=r"the table \('aggregate'\) goes through aggregate 'aggregate'; a lookup"):
        stream.lookup_join(counted, on=[("user", "uid")])
    upserts = p.source(log(str(tmp_path / "log"), changelog_mode="upsert", primary_key="order_id"), name="upserts")
    with pytest.raises(PlanError, match=r"'normalize upserts' is a changelog \(rows with updates and deletes\); a "):
        upserts.lookup_join(table, on=[("user", "uid")])
    numbers = p.source(datagen(rows=3, fields={"uid": sequence(), "label": sequence()}), name="numbers")
    stream.lookup_join(numbers, on=[("user", "uid")]).sink(parquet(tmp_path / "out"))
    with pytest.raises(PlanError, match=r"key 'user' of 'orders' is string but key 'uid' of 'numbers' is numeric"):
        p.plan()
    p = Pipeline()
    stream = p.source(log(str(tmp_path / "log")), name="orders")
    table = p.source(files(str(tmp_path / "users")), name="users")
    stream.lookup_join(table, on=[("user", "uid")]).sink(parquet(tmp_path / "joined"))
    table.sink(parquet(tmp_path / "copy"))  # a bounded source read as a stream too: refused in a streaming run
    with pytest.raises(
        PlanError, match=r"bounded ones only as the table of a lookup_join\(...\); bounded: \['users'\]"
    ):
        p.run(checkpoint=str(tmp_path / "ckpt"))
    p = Pipeline()
    stream = p.source(files(str(tmp_path / "users"), watch=True))  # named 'source: files (parquet)' too
    stream.lookup_join(p.source(files(str(tmp_path / "users"))), on="uid").sink(parquet(tmp_path / "same"))
    with pytest.raises(PlanError, match=r"have the same name and no uid.*\(a second stream, or a lookup table\)"):
        p.run(checkpoint=str(tmp_path / "ckpt2"))
