"""Kafka for real: a broker on loopback (``kafka_broker``), records produced with the pinned
client, keyed pipelines reading and writing topics, answers compared with pandas over all input.
The driver killed with SIGKILL while reading and writing Kafka: tests/test_exactly_once.py."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyflow import (
    DataError,
    ExternalSystemError,
    Pipeline,
    PlanError,
    RestoreError,
    kafka,
    kafka_sink,
    parquet,
    upsert_kafka,
    upsert_kafka_sink,
)
from keyflow.connectors.kafka.options import Client, Formats, Startup
from keyflow.connectors.kafka.source import KafkaSource
from keyflow.runtime.kafka_broker import LocalBroker
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.rollback import plan_rollback
from tests.kafka import produce, produce_raw, read_topic, upserted, values_frame
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, config, events, expected_totals, running_total

SCHEMA = "user STRING, amount BIGINT, seq BIGINT"


def totals_pipeline(broker: LocalBroker, parallelism: int, prefix: str) -> Pipeline:
    """Running totals per event (exactly-once into ``kk_totals``) and per-user counts (upserts into
    ``kk_counts``), reading ``kk_events`` from the start."""
    servers = broker.bootstrap_servers
    p = Pipeline(config=config(parallelism))
    source = kafka(
        "kk_events", bootstrap_servers=servers, schema=SCHEMA, startup_mode="earliest-offset", rows_per_batch=1_500
    )
    by_user = p.source(source).key_by("user")
    by_user.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="seq").sink(
        kafka_sink(
            "kk_totals", bootstrap_servers=servers, delivery_guarantee="exactly-once", transactional_id_prefix=prefix
        )
    )
    by_user.aggregate(events="count(*)", amount="sum(amount)").sink(
        upsert_kafka_sink("kk_counts", bootstrap_servers=servers, primary_key="user")
    )
    return p


@pytest.mark.jvm
def test_kafka_to_kafka_exactly_once_across_a_restart_a_live_rescale_new_partitions_and_a_broker_restart(
    kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    servers = kafka_broker.bootstrap_servers
    for topic, partitions in (("kk_events", 4), ("kk_totals", 3), ("kk_counts", 2)):
        kafka_broker.create_topic(topic, partitions)
    history = [events(2_000, 150, start=0, seed=31)]
    produce(servers, "kk_events", history[-1], key="user")
    checkpoint = str(tmp_path / "ckpt")
    totals_pipeline(kafka_broker, 2, "t1").run(checkpoint, available_now=True)

    history.append(events(2_000, 150, start=2_000, seed=32))
    produce(servers, "kk_events", history[-1], key="user")
    kafka_broker.add_partitions("kk_events", 6)  # read from their start at the next micro-batch
    history.append(events(600, 40, start=4_000, seed=33))
    produce(servers, "kk_events", history[-1].assign(user="new-" + history[-1]["user"]), key="user")
    history[-1] = history[-1].assign(user="new-" + history[-1]["user"])
    job = totals_pipeline(kafka_broker, 3, "t1").start(checkpoint)  # a restart at 3
    try:
        job.process_all_available()
        kafka_broker.restart()  # while the job runs: its readers and the transactional producer reconnect
        job.rescale(1, reason="test")  # live
        history.append(events(1_000, 150, start=4_600, seed=34))
        produce(servers, "kk_events", history[-1], key="user")
        job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 1
    finally:
        job.stop()

    everything = pd.concat(history)
    got = values_frame(read_topic(servers, "kk_totals")).sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(everything).reset_index(drop=True), check_dtype=False)
    counts = upserted(read_topic(servers, "kk_counts"))
    expected = everything.groupby("user").agg(events=("amount", "size"), amount=("amount", "sum"))
    assert {json.loads(key)["user"]: value for key, value in counts.items()} == {
        user: {"user": user, "events": int(row.events), "amount": int(row.amount)} for user, row in expected.iterrows()
    }


@pytest.mark.jvm
def test_malformed_records_fail_naming_topic_partition_and_offset_or_are_skipped_or_dead_letters(
    kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    servers = kafka_broker.bootstrap_servers
    kafka_broker.create_topic("dirty", 1)
    good = [json.dumps({"user": f"u{n}", "amount": n, "seq": n}).encode() for n in range(5)]
    produce_raw(
        servers,
        "dirty",
        [(None, value) for value in good[:3]] + [(None, b'{"user": "x", "amo')] + [(None, value) for value in good[3:]],
    )

    def run(name: str, **options: object) -> Pipeline:
        p = Pipeline(config=config(1))
        source = kafka("dirty", bootstrap_servers=servers, schema=SCHEMA, startup_mode="earliest-offset", **options)
        p.source(source).sink(parquet(str(tmp_path / name)))
        return p

    with pytest.raises(DataError, match=r"topic 'dirty' partition 0, the first at offset 3: b'\{\"user\": \"x\""):
        run("failed").run(str(tmp_path / "ckpt-fail"), available_now=True)
    assert not list((tmp_path / "failed").glob("part-*"))  # nothing committed
    run("skipped", ignore_parse_errors=True).run(str(tmp_path / "ckpt-skip"), available_now=True)
    assert pd.read_parquet(tmp_path / "skipped").sort_values("seq")["seq"].tolist() == list(range(5))
    run("kept", dead_letters=parquet(str(tmp_path / "letters"))).run(str(tmp_path / "ckpt-kept"), available_now=True)
    assert pd.read_parquet(tmp_path / "kept").sort_values("seq")["seq"].tolist() == list(range(5))
    letters = pd.read_parquet(tmp_path / "letters")
    assert letters[["topic", "partition", "offset"]].to_dict("records") == [
        {"topic": "dirty", "partition": 0, "offset": 3}
    ]
    assert letters["value"].iloc[0] == b'{"user": "x", "amo'
    assert letters["error"].iloc[0] == "not a json record of the source's columns"


@pytest.mark.jvm
def test_an_unreachable_broker_and_a_missing_topic_are_clear_errors_within_the_timeout(
    kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    from keyflow.runtime.kafka_broker import free_port

    def pipeline(servers: str, topic: str) -> Pipeline:
        p = Pipeline(config=config(1))
        source = kafka(topic, bootstrap_servers=servers, schema=SCHEMA, startup_mode="earliest-offset", timeout_s=3)
        p.source(source).sink(parquet(str(tmp_path / "out")))
        return p

    started = time.monotonic()
    with pytest.raises(ExternalSystemError, match=r"Kafka at 127.0.0.1:\d+ did not answer within 3 s"):
        pipeline(f"127.0.0.1:{free_port()}", "events").run(str(tmp_path / "c1"), available_now=True)
    assert time.monotonic() - started < 30
    with pytest.raises(ExternalSystemError, match=r"topic\(s\) \['nowhere'\] do not exist"):
        pipeline(kafka_broker.bootstrap_servers, "nowhere").run(str(tmp_path / "c2"), available_now=True)


@pytest.mark.jvm
def test_scan_parallelism_above_the_partitions_warns_that_tasks_idle(
    kafka_broker: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kafka_broker.create_topic("narrow", 1)
    produce(kafka_broker.bootstrap_servers, "narrow", events(50, 5, start=0, seed=1))
    p = Pipeline(config=config(1))
    source = kafka("narrow", bootstrap_servers=kafka_broker.bootstrap_servers, schema=SCHEMA,
                   startup_mode="earliest-offset")  # fmt: skip
    p.source(source, parallelism=3).sink(parquet(str(tmp_path / "out")))
    with caplog.at_level(logging.WARNING, logger="keyflow"):
        p.run(str(tmp_path / "ckpt"), available_now=True)
    assert "has 1 partition(s) and runs at scan parallelism 3: 2 subtask(s) will idle" in caplog.text
    assert len(pd.read_parquet(tmp_path / "out")) == 50


def test_plan_errors_before_spark_starts() -> None:
    servers = "127.0.0.1:9"
    with pytest.raises(PlanError, match=r"dead_letters='out' is not a sink; pass e.g. parquet"):
        kafka("t", bootstrap_servers=servers, schema=SCHEMA, startup_mode="latest-offset", dead_letters="out")
    java_only = kafka("t", bootstrap_servers=servers, schema=SCHEMA, startup_mode="latest-offset",
                      properties={"sasl.jaas.config": "x"})  # fmt: skip
    with pytest.raises(PlanError, match=r"keyflow's client is librdkafka.*sasl.jaas.config: use sasl.username"):
        java_only.current_splits()
    with pytest.raises(PlanError, match=r"needs 'sink\.transactional-id-prefix'"):
        kafka_sink("t", bootstrap_servers=servers, delivery_guarantee="exactly-once")
    with pytest.raises(PlanError, match="did you mean 'exactly-once'"):
        kafka_sink("t", bootstrap_servers=servers, delivery_guarantee="exactly_once")
    with pytest.raises(PlanError, match=r"needs 'properties\.group\.id'"):
        kafka("t", bootstrap_servers=servers, schema=SCHEMA)
    with pytest.raises(PlanError, match="did you mean 'earliest-offset'"):
        kafka("t", bootstrap_servers=servers, schema=SCHEMA, startup_mode="earliest")
    with pytest.raises(PlanError, match=r"'key.fields' names \['id'\]"):
        kafka("t", bootstrap_servers=servers, schema=SCHEMA, key_format="json", key_fields="id",
              startup_mode="latest-offset")  # fmt: skip
    p = Pipeline(config=config(1))
    changes = p.source(
        upsert_kafka("accounts", bootstrap_servers=servers, schema="id STRING, balance BIGINT", primary_key="id")
    )
    with pytest.raises(PlanError, match=r"takes inserts only, but .* is a changelog"):
        changes.sink(kafka_sink("out", bootstrap_servers=servers))
    with pytest.raises(PlanError, match=r"writes by key \['id'\], but primary_key=\['balance'\]"):
        changes.sink(upsert_kafka_sink("out", bootstrap_servers=servers, primary_key="id"), primary_key="balance")
    with pytest.raises(PlanError, match=r"record key holds \['id'\], the primary key is \['balance'\]"):
        KafkaSource(("t",), None, "id STRING, balance BIGINT", Client(servers), Startup("earliest-offset"),
                    Formats("json", "json", ("id",)), primary_key=("balance",))  # fmt: skip


def pre_keyed_sums(broker: LocalBroker, base: Path, parallelism: int) -> Pipeline:
    p = Pipeline(config=config(parallelism, **{"state.checkpoints.num-retained": 100}))
    source = kafka("keyed", bootstrap_servers=broker.bootstrap_servers, schema=SCHEMA, startup_mode="earliest-offset")
    keyed = p.source(source).reinterpret_as_keyed("user")
    keyed.aggregate(n="count(*)", amount="sum(amount)").sink(parquet(str(base / "sums")))
    return p


@pytest.mark.jvm
def test_pre_keyed_topic_rescales_live_2_4_2_and_on_restart_with_partitions_added_and_catches_a_key_in_two(
    kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    """A topic whose producer partitioned by key is read with no shuffle: 8 partitions, live
    2 → 4 → 2 with 2 partitions added in between (new keys there), a restart at 3; then a key
    written to a second partition fails the micro-batch before it commits."""
    from tests.test_pre_keyed import expected_sums, final_sums

    servers = kafka_broker.bootstrap_servers
    kafka_broker.create_topic("keyed", 8)
    parts = [events(1_500, 120, start=0, seed=41)]
    placed = produce(servers, "keyed", parts[-1], key="user", partitions=8)
    job = pre_keyed_sums(kafka_broker, tmp_path, 2).start(str(tmp_path / "ckpt"))
    try:
        job.process_all_available()
        job.rescale(4, reason="test")
        more = events(1_000, 120, start=1_500, seed=42)
        for half in (more.iloc[:500], more.iloc[500:]):  # from the micro-batch after the next, as below
            parts.append(half)
            produce(servers, "keyed", half, key="user", partitions=8, partition_of=placed)
            job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 4
        kafka_broker.add_partitions("keyed", 10)
        job.rescale(2, reason="test")  # from the micro-batch after the next (Spark plans its source first)
        for number, seed in enumerate((43, 45)):
            new_users = events(300, 20, start=2_500 + 300 * number, seed=seed)
            parts.append(new_users.assign(user="new-" + new_users["user"]))
            produce(servers, "keyed", parts[-1], key="user", partitions=10, partition_of={
                user: 8 + int(user.rsplit("u", 1)[1]) % 2 for user in set(parts[-1]["user"])
            })  # fmt: skip
            job.process_all_available()
        assert job.last_batch is not None
        assert job.last_batch.parallelism == 2
    finally:
        job.stop()
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    assert [(e["from"], e["to"]) for e in checkpoint.events()] == [(2, 4), (4, 2)]
    manifest = checkpoint.manifests.latest()
    assert manifest is not None
    assert len(set(manifest.pre_keyed["splits"])) == 10  # each partition its own key group
    pd.testing.assert_frame_equal(final_sums(tmp_path / "sums"), expected_sums(pd.concat(parts)), check_dtype=False)
    parts.append(events(400, 120, start=3_100, seed=44))  # and a restart at 3
    produce(servers, "keyed", parts[-1], key="user", partitions=8, partition_of=placed)
    pre_keyed_sums(kafka_broker, tmp_path, 3).run(str(tmp_path / "ckpt"), available_now=True)
    pd.testing.assert_frame_equal(final_sums(tmp_path / "sums"), expected_sums(pd.concat(parts)), check_dtype=False)

    moved = parts[0].head(1)  # an existing user, written to another partition
    produce(
        servers,
        "keyed",
        moved,
        key="user",
        partitions=10,
        partition_of={moved["user"].iloc[0]: (placed[moved["user"].iloc[0]] + 1) % 8},
    )
    with pytest.raises(DataError, match="a key must be in exactly one split"):
        pre_keyed_sums(kafka_broker, tmp_path, 3).run(str(tmp_path / "ckpt"), available_now=True)


def account_changes(seed: int, accounts: int, changes: int) -> pd.DataFrame:
    """Upserts and deletes (``balance`` None: a tombstone) of accounts, in the order produced."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "id": rng.integers(0, accounts, changes),
            "region": [f"r{n}" for n in rng.integers(0, 6, changes)],
            "balance": rng.integers(0, 1_000, changes).astype(object),
        }
    )
    frame.loc[rng.random(changes) < 0.15, "balance"] = None
    return frame


def produce_changes(servers: str, topic: str, frame: pd.DataFrame) -> None:
    """Each change keyed by its account; a delete is a tombstone (no value)."""
    records = []
    for row in frame.itertuples():
        value = {"id": int(row.id), "region": row.region, "balance": row.balance}
        records.append(
            (json.dumps({"id": int(row.id)}).encode(), None if row.balance is None else json.dumps(value).encode())
        )
    produce_raw(servers, topic, records, partition=None)


@pytest.mark.jvm
def test_sql_upsert_kafka_changelog_into_an_exactly_once_upsert_kafka_aggregate(
    kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    """A compacted topic read as a changelog (tombstones delete), aggregated with SQL's GROUP BY
    (retracting), written as upserts and tombstones in Kafka transactions; two runs."""
    servers = kafka_broker.bootstrap_servers
    kafka_broker.create_topic("accounts", 3)
    kafka_broker.create_topic("per_region", 2)
    script = f"""
    SET 'parallelism.default' = '2';
    CREATE TABLE accounts (id BIGINT, region STRING, balance BIGINT, PRIMARY KEY (id) NOT ENFORCED)
    WITH ('connector' = 'upsert-kafka', 'topic' = 'accounts', 'properties.bootstrap.servers' = '{servers}',
          'key.format' = 'json', 'value.format' = 'json', 'scan.rows-per-batch' = '1500');
    CREATE TABLE per_region (region STRING, accounts BIGINT, total BIGINT, PRIMARY KEY (region) NOT ENFORCED)
    WITH ('connector' = 'upsert-kafka', 'topic' = 'per_region', 'properties.bootstrap.servers' = '{servers}',
          'key.format' = 'json', 'value.format' = 'json', 'sink.delivery-guarantee' = 'exactly-once',
          'sink.transactional-id-prefix' = 'sql-per-region');
    INSERT INTO per_region SELECT region, COUNT(*), SUM(balance) FROM accounts GROUP BY region;
    """
    history = [account_changes(51, 400, 2_500)]
    produce_changes(servers, "accounts", history[-1])
    pipeline = Pipeline(config=config(2))
    pipeline.sql(script)
    pipeline.run(str(tmp_path / "ckpt"), available_now=True)
    first_run = Checkpoint(str(tmp_path / "ckpt")).manifests.versions()[-1]
    history.append(account_changes(52, 400, 1_500))
    history[-1].loc[history[-1]["region"] == "r0", "balance"] = None  # every r0 account it touches is deleted
    produce_changes(servers, "accounts", history[-1])
    pipeline = Pipeline(config=config(3))
    pipeline.sql(script)
    pipeline.run(str(tmp_path / "ckpt"), available_now=True)

    latest = pd.concat(history).groupby("id").tail(1)
    alive = latest[latest["balance"].notna()].astype({"balance": "int64"})
    expected = alive.groupby("region").agg(accounts=("id", "size"), total=("balance", "sum"))
    got = upserted(read_topic(servers, "per_region"))
    assert {json.loads(key)["region"]: value for key, value in got.items()} == {
        region: {"region": region, "accounts": int(row.accounts), "total": int(row.total)}
        for region, row in expected.iterrows()
    }
    plan_rollback(Checkpoint(str(tmp_path / "ckpt")), first_run).apply()  # Kafka cannot take the rest back
    with pytest.raises(
        RestoreError, match=rf"published micro-batches up to \d+, but the checkpoint ends at {first_run}"
    ):
        pipeline.run(str(tmp_path / "ckpt"), available_now=True)


@pytest.mark.jvm
def test_the_kafka_page_examples_run_and_agree(
    kafka_broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/kafka.md's Python example as a user runs it (against this broker), then its SQL
    twin on the same topic into another: both equal pandas."""
    from tests.test_docs import DOCS, python_blocks

    servers = kafka_broker.bootstrap_servers
    for topic, partitions in (("clicks", 4), ("totals", 2), ("sql_totals", 2)):
        kafka_broker.create_topic(topic, partitions)
    clicks = events(800, 30, start=0, seed=61)[["user", "amount"]]
    produce(servers, "clicks", clicks, key="user")
    page = (DOCS / "kafka.md").read_text()
    [example] = python_blocks(DOCS / "kafka.md")
    monkeypatch.chdir(tmp_path)
    exec(compile(example.replace("127.0.0.1:9092", servers), "docs/kafka.md", "exec"), {"__name__": "docs_example"})
    sql = page.split("```sql\n", 1)[1].split("```", 1)[0].replace("127.0.0.1:9092", servers)
    pipeline = Pipeline(config=config(2))
    pipeline.sql(sql.replace("'totals'", "'sql_totals'").replace("'clicks-totals'", "'sql-clicks-totals'"))
    pipeline.run(str(tmp_path / "sql-checkpoint"), available_now=True)

    expected = clicks.groupby("user").agg(clicks=("amount", "size"), amount=("amount", "sum"))
    want = {user: {"user": user, "clicks": int(r.clicks), "amount": int(r.amount)} for user, r in expected.iterrows()}
    for topic in ("totals", "sql_totals"):
        got = upserted(read_topic(servers, topic))
        assert {json.loads(key)["user"]: value for key, value in got.items()} == want, topic


def test_records_decode_in_one_call_and_malformed_ones_are_found_one_by_one() -> None:
    """Arrow decodes the batch at once; an empty, a whitespace-only, a mistyped or a two-object
    record is malformed, a record spanning lines (pretty JSON) is not; CSV and raw alike."""
    import pyarrow as pa

    from keyflow.connectors.kafka.formats import decode, decode_aligned

    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    table, bad = decode([b'{"a": 1, "s": "x"}', b'{"s": "y", "a": 2, "z": 0}'], "json", schema)
    assert table.to_pylist() == [{"a": 1, "s": "x"}, {"a": 2, "s": "y"}]
    assert bad.tolist() == []
    records = [b'{"a": 1}', b"", b"  ", b'{"a": "q"}', b'{\n  "a": 5\n}', b'{"a": 6}{"a": 7}']
    table, bad = decode(records, "json", schema)
    assert table.column("a").to_pylist() == [1, 5]
    assert bad.tolist() == [1, 2, 3, 5]
    table, bad = decode([b"1,x", b"2,", b"nope,z"], "csv", schema)
    assert table.to_pylist() == [{"a": 1, "s": "x"}, {"a": 2, "s": ""}]
    assert bad.tolist() == [2]
    raw = pa.schema([("line", pa.string())])
    table, bad = decode([b"a b", b"\xff"], "raw", raw)  # invalid UTF-8 for a STRING column
    assert (table.column("line").to_pylist(), bad.tolist()) == (["a b"], [1])
    aligned, bad, present = decode_aligned([b'{"a": 1}', None, b"x"], "json", schema)
    assert aligned.column("a").to_pylist() == [1, None, None]
    assert (bad.tolist(), present.tolist()) == ([False, False, True], [True, False, True])
