"""What keyflow asks the brokers, through confluent-kafka (librdkafka): partitions, offsets, and
the errors a user can act on — an unreachable broker within a bounded time, a missing topic."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from keyflow.connectors.kafka.options import Client
from keyflow.errors import ExternalSystemError, PlanError

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata

Split = tuple[str, int]
"""A topic partition: keyflow's split."""


def split_name(split: Split) -> str:
    return f"{split[0]}:{split[1]}"


def parse_split(name: str) -> Split:
    topic, _, partition = name.rpartition(":")
    return topic, int(partition)


def unreachable(client: Client, error: object) -> ExternalSystemError:
    return ExternalSystemError(
        f"Kafka at {client.bootstrap_servers} did not answer within {client.timeout_s:g} s ({error}); check "
        "'properties.bootstrap.servers' and that the brokers run and are reachable from the driver and the workers"
    )


# Errors of a broker that is restarting or moving leaders: the call is repeated.
_RETRIABLE = {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "LEADER_NOT_AVAILABLE",
              "NOT_LEADER_FOR_PARTITION", "NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
              "OFFSET_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "BROKER_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR",
              "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "_NOENT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT",
              "_WAIT_COORD"}  # fmt: skip
_T = TypeVar("_T")


def is_retriable(code: object) -> bool:
    return isinstance(code, KafkaError) and (code.retriable() or code.name() in _RETRIABLE)


def retrying(
    client: Client, call: Callable[[], _T], backoff: float = 0.1, on_retry: Callable[[], None] | None = None
) -> _T:
    """``call()``, again with growing pauses while the brokers answer with a retriable error
    (a coordinator still loading, a leader moving: a broker restarting), for at most the client's
    timeout; then the last error. ``on_retry`` runs before each retry (e.g. a fresh client:
    one may keep stale leaders after a broker restart)."""
    deadline = time.monotonic() + client.timeout_s
    while True:
        try:
            return call()
        except KafkaException as error:
            if not is_retriable(error.args[0]) or time.monotonic() + backoff > deadline:
                raise
            time.sleep(backoff)
            if on_retry is not None:
                on_retry()
            backoff = min(backoff * 2, 2.0)


def admin_client(client: Client) -> AdminClient:
    try:
        return AdminClient(client.config())
    except KafkaException as error:
        raise PlanError(
            f"Kafka client properties {sorted(client.properties)}: {error.args[0]}; keyflow's client is librdkafka, "
            "whose properties are mostly the Java client's but not all (e.g. sasl.jaas.config: use sasl.username "
            "and sasl.password): see librdkafka's CONFIGURATION.md"
        ) from None


class Brokers:
    """A driver-side admin connection; every call is bounded by the client's timeout."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.admin = admin_client(client)

    def _reconnect(self) -> None:
        self.admin = admin_client(self.client)

    def metadata(self, topic: str | None = None) -> ClusterMetadata:
        try:
            return self.admin.list_topics(topic, timeout=self.client.timeout_s)
        except KafkaException as error:
            raise unreachable(self.client, error.args[0]) from None

    def splits(self, topics: tuple[str, ...], pattern: str | None, where: str) -> list[Split]:
        """Every partition of ``topics`` (each must exist) or of the topics ``pattern`` matches
        now, in (topic, partition) order: the order splits are numbered in."""
        found = self.metadata().topics
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(name for name in found if regex.fullmatch(name) and not name.startswith("__"))
        else:
            missing = [name for name in topics if name not in found or found[name].error is not None]
            if missing:
                raise ExternalSystemError(
                    f"{where}: topic(s) {missing} do not exist on {self.client.bootstrap_servers}; create them "
                    "(kafka-topics --create) or check 'topic'"
                )
            names = list(topics)
        return [(name, partition) for name in names for partition in sorted(found[name].partitions)]

    def offsets(self, splits: list[Split], spec: OffsetSpec, committed_only: bool = True) -> dict[Split, int]:
        """The offset ``spec`` names in each split; the latest is the last stable offset when
        ``committed_only`` (read_committed: an open transaction's records are not counted yet)."""
        if not splits:
            return {}
        level = IsolationLevel.READ_COMMITTED if committed_only else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(topic, partition): spec for topic, partition in splits}

        def listed() -> dict[Split, int]:
            futures = self.admin.list_offsets(request, isolation_level=level, request_timeout=self.client.timeout_s)
            return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}

        try:
            return retrying(self.client, listed, on_retry=self._reconnect)
        except KafkaException as error:
            raise unreachable(self.client, error.args[0]) from None

    def committed(self, group: str, splits: list[Split]) -> dict[Split, int]:
        """The offsets ``group`` committed (splits it has none for are left out)."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        if not splits:
            return {}
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in splits])]

        def offsets() -> Any:
            futures = self.admin.list_consumer_group_offsets(request, request_timeout=self.client.timeout_s)
            return next(iter(futures.values())).result()

        try:
            listed = retrying(self.client, offsets, on_retry=self._reconnect)
        except KafkaException as error:
            raise unreachable(self.client, error.args[0]) from None
        return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions if tp.offset >= 0}
