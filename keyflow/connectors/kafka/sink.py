"""Kafka sinks: ``kafka_sink(...)`` (inserts) and ``upsert_kafka_sink(...)`` (a changelog as
upserts and tombstones by key), with Flink's ``sink.delivery-guarantee``:

- ``at-least-once`` (Flink's default) and ``none``: each subtask produces its rows while the
  micro-batch runs and waits for the brokers' acknowledgements (at-least-once) before the
  checkpoint commits; a replayed micro-batch produces them again.
- ``exactly-once``: two phases, as Flink's ``KafkaSink``, with keyflow's manifest as the commit
  point. Subtasks stage the encoded records in the checkpoint (replays overwrite them); after the
  manifest commits the driver produces them in one Kafka transaction (``transactional.id`` =
  ``sink.transactional-id-prefix``), which also commits the micro-batch's number as the offset of
  a marker consumer group. A restart publishes a committed micro-batch again only if the marker
  is behind it; a transaction cut off by a crash is aborted by the next producer with that id.
  Consumers with ``isolation.level=read_committed`` see every record exactly once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from keyflow.changelog import OP
from keyflow.connectors.base import Moves
from keyflow.connectors.kafka.client import retrying
from keyflow.connectors.kafka.options import DELIVERY_GUARANTEES, Client, Formats, choice, split_list
from keyflow.errors import ExternalSystemError, PlanError, RestoreError, WorkerError
from keyflow.paths import OBJECT_STORES, filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("keyflow")
KEY, VALUE = "__kafka_key", "__kafka_value"
# A micro-batch's transaction may stay open this long: the brokers' default transaction.max.timeout.ms
# (Flink's KafkaSink asks 1 h, which needs that raised); 'properties.transaction.timeout.ms' overrides.
TRANSACTION_TIMEOUT_MS = 900_000
_PUBLISHED = "published"


class KafkaSink:
    """Writes rows to one topic as records: the key (``key_fields`` in ``key_format``; none:
    null keys, spread by the producer) and the value. An upsert sink (``primary_key``) writes a
    changelog: +I/+U as records, -D as tombstones, -U dropped (Flink's upsert-kafka)."""

    def __init__(
        self,
        topic: str,
        client: Client,
        formats: Formats,
        delivery_guarantee: str = "at-least-once",
        transactional_id_prefix: str | None = None,
        primary_key: tuple[str, ...] = (),
    ) -> None:
        if not topic or ";" in topic:
            raise PlanError(f"a Kafka sink writes one topic, got {topic!r}")
        self.topic, self.client, self.formats, self.primary_key = topic, client, formats, primary_key
        self.delivery_guarantee = choice(delivery_guarantee, DELIVERY_GUARANTEES, "'sink.delivery-guarantee'")
        if self.delivery_guarantee == "exactly-once" and not transactional_id_prefix:
            raise PlanError(
                f"Kafka sink {topic!r}: 'sink.delivery-guarantee' = 'exactly-once' needs 'sink.transactional-id-prefix'"
                " (as in Flink): a prefix no other job writing to the same Kafka cluster uses"
            )
        self.transactional_id = transactional_id_prefix
        self.staging: str | None = None
        self._transactions: _Transactions | None = None

    @property
    def append_only(self) -> bool:
        """A plain Kafka sink takes inserts only (as Flink's): a changelog needs upsert-kafka."""
        return not self.primary_key

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "connector": "upsert-kafka" if self.primary_key else "kafka",
            "topic": self.topic,
            "properties.bootstrap.servers": self.client.bootstrap_servers,
            "value.format": self.formats.value,
            "sink.delivery-guarantee": self.delivery_guarantee,
        }
        if self.formats.key:
            described.update({"key.format": self.formats.key, "key.fields": ";".join(self.formats.key_fields)})
        return described

    def stage_in(self, directory: str) -> None:
        """Where an exactly-once sink stages micro-batches: the runtime gives it a directory in
        the checkpoint before a streaming run. Spark writes the staged files through its own
        (Hadoop's) filesystems, which keyflow does not configure for object stores."""
        if self.delivery_guarantee == "exactly-once" and isinstance(filesystem(directory)[0], OBJECT_STORES):
            raise PlanError(
                f"Kafka sink {self.topic!r} is exactly-once and stages each micro-batch in the checkpoint, which is on "
                f"an object store ({directory.rsplit('/staged/', 1)[0]}), where Spark cannot write without s3a; "
                "give the pipeline a checkpoint on HDFS or a shared filesystem, or make the sink at-least-once"
            )
        self.staging = directory

    def _records(self, frame: DataFrame) -> DataFrame:
        """The frame as key and value bytes; a changelog's -U rows dropped, -D rows as tombstones."""
        from pyspark.sql import functions as F

        from keyflow.connectors.kafka.formats import encode

        columns = tuple(name for name in frame.columns if name != OP)
        self.formats.check_columns(columns, f"Kafka sink {self.topic!r}")
        value = encode(self.formats.value_columns(columns), self.formats.value)
        if OP in frame.columns:
            frame = frame.where(F.col(OP) != "-U")
            value = F.when(F.col(OP) == "-D", F.lit(None).cast("binary")).otherwise(value)
        key = encode(self.formats.key_fields, self.formats.key) if self.formats.key else F.lit(None).cast("binary")
        return frame.select(key.alias(KEY), value.alias(VALUE))

    def write(self, frame: DataFrame) -> int:
        """A batch run: every row produced by the subtasks, acknowledged before it returns."""
        config = self._producer_config()
        topic, timeout = self.topic, self.client.timeout_s

        def produce(batches: Any) -> Any:
            import pyarrow as pa

            yield pa.RecordBatch.from_pydict({"rows": [_produce(config, topic, batches, timeout)]})

        counted = self._records(frame).mapInArrow(produce, "rows BIGINT").toArrow()
        return int(sum(counted.column("rows").to_pylist()))

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        if self.delivery_guarantee != "exactly-once":
            return self.write(frame), []
        from keyflow.connectors.files import counted_write

        if self.staging is None:
            raise PlanError(f"Kafka sink {self.topic!r} is exactly-once but was given no staging directory")
        staged = f"{self.staging}/batch-{batch:010d}"
        rows = counted_write(self._records(frame), lambda observed: observed.write.mode("overwrite").parquet(staged))
        return rows, [[staged, f"kafka:{self.topic}#{batch}"]]

    def publish(self, moves: Moves) -> None:
        """Produce each staged micro-batch in one transaction with its marker (skipped where the
        marker shows it published); then remove the staged files."""
        for staged, target in moves:
            self._publish(staged, int(target.rsplit("#", 1)[1]))

    def _publish(self, staged: str, batch: int) -> None:
        import pyarrow.parquet as pq

        from keyflow.paths import exists, filesystem

        files, path = filesystem(staged)
        if self._transactions is None:  # one producer per run: init_transactions fences the last one
            self._transactions = _Transactions(self).open()
        transactions = self._transactions
        try:
            # Staged files are removed only after their transaction committed: none left means
            # published (the marker's offset may have expired: offsets.retention.minutes).
            if not exists(files, path) or transactions.published() > batch:
                log.info("Kafka sink %r: micro-batch %d was published before", self.topic, batch)
            else:
                transactions.publish(pq.read_table(staged, filesystem=files), batch)
        except BaseException:
            self._transactions = None  # a new producer aborts whatever this one left open
            transactions.close()
            raise
        if exists(files, path):
            files.delete_dir(path)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_transactions": None}  # clients stay in the driver

    def reset(self) -> None:
        """A new checkpoint: its micro-batches count from 0 again, so the marker is removed
        (records already in the topic stay: Kafka cannot take them back)."""
        if self.delivery_guarantee == "exactly-once":
            marker = _Transactions(self).open()  # fences a producer a crash left, then forgets the marker
            try:
                marker.forget()
            finally:
                marker.close()

    def discard_after(self, batch: int) -> None:
        """Kafka cannot take records back: a checkpoint older than what this sink published
        (rolled back, or restored from a copy) is refused rather than its micro-batches written
        twice or skipped."""
        if self.delivery_guarantee != "exactly-once":
            return
        if self._transactions is None:
            self._transactions = _Transactions(self).open()
        published = self._transactions.published()
        if published > batch + 1:
            raise RestoreError(
                f"Kafka sink {self.topic!r} published micro-batches up to {published - 1}, but the checkpoint ends at "
                f"{batch}: Kafka cannot take records back, so the micro-batches in between would be written twice or "
                f"lost; roll back no further than version {published - 1}, or start a new checkpoint (and topic)"
            )

    def _producer_config(self) -> dict[str, Any]:
        acks = "0" if self.delivery_guarantee == "none" else "all"
        return self.client.config(
            **{"acks": acks, "enable.idempotence": acks == "all", "partitioner": "murmur2_random", "linger.ms": 20}
        )


def _produce(config: dict[str, Any], topic: str, batches: Any, timeout: float) -> int:
    """Produce the records of Arrow ``batches`` (key, value columns); returns how many, after
    every one was acknowledged (a failed delivery raises)."""
    from confluent_kafka import KafkaException, Producer

    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(config)
    rows = 0
    try:
        for batch in batches:
            rows += _send(producer, topic, batch, delivered)
        if producer.flush(timeout) > 0 or failures:
            raise ExternalSystemError(
                f"Kafka sink {topic!r}: {len(failures) or 'some'} record(s) not acknowledged within {timeout:g} s "
                f"({failures[0] if failures else 'timeout'}); the micro-batch is not committed and runs again"
            )
    except KafkaException as error:
        raise WorkerError(ExternalSystemError(f"Kafka sink {topic!r}: {error.args[0]}")) from None
    except ExternalSystemError as error:
        raise WorkerError(error) from None
    return rows


def _send(producer: Any, topic: str, batch: Any, delivered: Any = None) -> int:
    """Hand one Arrow batch's records (key, value columns) to ``producer``; returns how many."""
    keys, values = batch.column(0).to_pylist(), batch.column(1).to_pylist()
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
    producer.poll(0)
    return len(keys)


class _Transactions:
    """The driver's transactional producer of an exactly-once sink and its marker group."""

    def __init__(self, sink: KafkaSink) -> None:
        self.sink = sink
        self.marker = f"{sink.transactional_id}-{_PUBLISHED}"

    def open(self) -> _Transactions:
        from confluent_kafka import Consumer, KafkaException, Producer

        client = self.sink.client
        self.consumer = Consumer(client.config(**{"group.id": self.marker, "enable.auto.commit": False}))
        config = {
            **self.sink._producer_config(),
            "transactional.id": self.sink.transactional_id,
            "transaction.timeout.ms": client.properties.get("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS),
        }
        self.producer = Producer(config)
        producer = self.producer
        try:  # fences an older producer with this id and aborts its open transaction
            retrying(client, lambda: producer.init_transactions(client.timeout_s))
        except KafkaException as error:
            raise self._failed(error) from None
        return self

    def close(self) -> None:
        self.consumer.close()

    def _failed(self, error: Exception) -> ExternalSystemError:
        return ExternalSystemError(
            f"Kafka sink {self.sink.topic!r} (transactional.id {self.sink.transactional_id!r}) at "
            f"{self.sink.client.bootstrap_servers}: {error.args[0] if error.args else error}; the micro-batch is "
            "committed and is published when the pipeline runs again"
        )

    def published(self) -> int:
        """How many micro-batches were published (the marker's offset; 0: none)."""
        from confluent_kafka import KafkaException, TopicPartition

        client = self.sink.client
        try:
            [marked] = retrying(
                client, lambda: self.consumer.committed([TopicPartition(self.sink.topic, 0)], client.timeout_s)
            )
        except KafkaException as error:
            raise self._failed(error) from None
        return max(marked.offset, 0)

    def publish(self, records: Any, batch: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        producer, topic = self.producer, self.sink.topic
        try:
            producer.begin_transaction()
            for chunk in records.to_batches(100_000):
                _send(producer, topic, chunk)
            marker = [TopicPartition(topic, 0, batch + 1)]
            producer.send_offsets_to_transaction(
                marker, self.consumer.consumer_group_metadata(), self.sink.client.timeout_s
            )
            producer.commit_transaction(self.sink.client.timeout_s)
        except KafkaException as error:
            raise self._failed(error) from None

    def forget(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        client = self.sink.client
        admin = AdminClient(client.config())
        try:
            retrying(
                client,
                lambda: admin.delete_consumer_groups([self.marker], request_timeout=client.timeout_s)[
                    self.marker
                ].result(),
            )
        except KafkaException as error:
            if "GROUP_ID_NOT_FOUND" not in str(error):
                raise self._failed(error) from None


def kafka_sink(
    topic: str,
    *,
    bootstrap_servers: str,
    format: str = "json",
    key_format: str | None = None,
    key_fields: str | list[str] | None = None,
    value_fields_include: str = "ALL",
    delivery_guarantee: str = "at-least-once",
    transactional_id_prefix: str | None = None,
    properties: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> KafkaSink:
    """Write inserts to a Kafka topic (Flink's ``kafka`` sink: ``delivery_guarantee`` is
    ``sink.delivery-guarantee``, at-least-once by default; exactly-once needs
    ``transactional_id_prefix``)."""
    formats = Formats(format, key_format, split_list(key_fields), value_fields_include)
    client = Client.of(bootstrap_servers, properties, timeout_s)
    return KafkaSink(topic, client, formats, delivery_guarantee, transactional_id_prefix)


def upsert_kafka_sink(
    topic: str,
    *,
    bootstrap_servers: str,
    primary_key: str | list[str],
    key_format: str = "json",
    value_format: str = "json",
    value_fields_include: str = "ALL",
    delivery_guarantee: str = "at-least-once",
    transactional_id_prefix: str | None = None,
    properties: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> KafkaSink:
    """Write a changelog to a (compacted) topic by ``primary_key`` (Flink's ``upsert-kafka``):
    inserts and updates as records keyed by the primary key, deletes as tombstones."""
    keys = split_list(primary_key)
    formats = Formats(value_format, key_format, keys, value_fields_include)
    client = Client.of(bootstrap_servers, properties, timeout_s)
    return KafkaSink(topic, client, formats, delivery_guarantee, transactional_id_prefix, keys)
