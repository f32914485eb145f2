"""Helpers for tests against the real Kafka broker (the ``kafka_broker`` fixture): records
produced with the pinned client, topics read back as a ``read_committed`` consumer would."""

from __future__ import annotations

import json
import zlib

import pandas as pd
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient


def produce(
    servers: str,
    topic: str,
    frame: pd.DataFrame,
    key: str | None = None,
    partitions: int | None = None,
    partition_of: dict[str, int] | None = None,
) -> dict[str, int]:
    """``frame``'s rows as JSON records; with ``key`` the record key is ``{"key": value}``, and with
    ``partitions`` each key goes to ``crc32(key) % partitions`` (a partitioner of the test's own,
    ``partition_of`` overriding it per key). Returns the partition of each key."""
    producer = Producer({"bootstrap.servers": servers, "log_level": 0, "linger.ms": 5})
    placed: dict[str, int] = {}
    for row in json.loads(frame.to_json(orient="records")):
        options: dict[str, object] = {}
        if key is not None:
            options["key"] = json.dumps({key: row[key]}, separators=(",", ":"))
            if partitions is not None:
                partition = (partition_of or {}).get(row[key], zlib.crc32(str(row[key]).encode()) % partitions)
                options["partition"] = placed.setdefault(row[key], partition)
        while True:
            try:
                producer.produce(topic, json.dumps(row), **options)  # type: ignore[arg-type]
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(30) == 0
    return placed


def produce_raw(
    servers: str, topic: str, records: list[tuple[bytes | None, bytes | None]], partition: int | None = 0
) -> None:
    """Records as they are, to one ``partition`` (None: the producer partitions by key)."""
    producer = Producer({"bootstrap.servers": servers, "log_level": 0, "partitioner": "murmur2_random"})
    for key, value in records:
        if partition is None:
            producer.produce(topic, value, key)
        else:
            producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def read_topic(servers: str, topic: str, committed: bool = True) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` now (keys and values), as a ``read_committed`` consumer sees them."""
    metadata = AdminClient({"bootstrap.servers": servers, "log_level": 0}).list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "tests",
            "log_level": 0,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0) for partition in partitions])
    records, ended = [], set()
    try:
        while len(ended) < len(partitions):
            message = consumer.poll(30)
            assert message is not None, f"topic {topic}: no end of partitions {set(partitions) - ended} within 30 s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
            else:
                records.append((message.key(), message.value()))
    finally:
        consumer.close()
    return records


def values_frame(records: list[tuple[bytes | None, bytes | None]]) -> pd.DataFrame:
    """The JSON values of ``records`` as rows (tombstones left out)."""
    return pd.DataFrame([json.loads(value) for _, value in records if value is not None])


def upserted(records: list[tuple[bytes | None, bytes | None]]) -> dict[str, dict[str, object]]:
    """A compacted topic's current rows by key: the newest value per key, a tombstone deleting it."""
    current: dict[str, dict[str, object]] = {}
    for key, value in records:
        assert key is not None
        if value is None:
            current.pop(key.decode(), None)
        else:
            current[key.decode()] = json.loads(value)
    return current
