"""A single-node Apache Kafka broker in KRaft mode on loopback: for the tests and for trying
Kafka pipelines on one machine (``keyflow kafka broker``). Its jars are the pinned ones of
``jvm/kafka/pom.xml``, fetched into ``.jvm/kafka`` by ``scripts/fetch-jvm.sh``.

Each broker gets its own directory (data and ``broker.log``) and free ports, so tests running in
parallel never share one; :meth:`LocalBroker.stop` kills its whole process group.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from keyflow.errors import EngineError
from keyflow.runtime.java import java_executable

JARS_ENV = "KEYFLOW_KAFKA_JARS"
_REPOSITORY = Path(__file__).resolve().parents[2]
_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
"""


def kafka_jars() -> Path:
    """The broker's jars: ``$KEYFLOW_KAFKA_JARS`` or the set-up's ``.jvm/kafka``."""
    jars = Path(os.environ.get(JARS_ENV) or _REPOSITORY / ".jvm" / "kafka")
    if not (jars / ".fetched").exists() and not any(jars.glob("kafka_*.jar")):
        raise EngineError(
            f"no Kafka broker jars in {jars}; fetch them with scripts/fetch-jvm.sh (make test does), or point "
            f"{JARS_ENV} at a directory holding the jars of Apache Kafka 4.x"
        )
    return jars


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalBroker:
    """``with LocalBroker() as broker: broker.bootstrap_servers`` — started, then always stopped."""

    def __init__(self, directory: str | Path | None = None, port: int | None = None, heap: str = "512m") -> None:
        self._owns_directory = directory is None  # a temporary one is removed by stop()
        self.directory = Path(directory or tempfile.mkdtemp(prefix="keyflow-kafka-"))
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
        }
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.directory / "log4j2.properties").write_text(_LOG4J.format(level="WARN", log=self.log_file))
        return config

    def _java(self, *arguments: str) -> list[str]:
        return [
            java_executable(),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            f"{kafka_jars()}/*",
            *arguments,
        ]

    def start(self, timeout: float = 60.0) -> LocalBroker:
        """Format the storage once, start the broker and wait until it serves requests."""
        config = self._write_config()
        if not (self.directory / "data" / "meta.properties").exists():
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            formatted = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config)),
                capture_output=True,
                text=True,
                check=False,
            )
            if formatted.returncode != 0:
                raise EngineError(f"formatting the Kafka broker's storage failed: {formatted.stderr.strip()[-2000:]}")
        with open(self.directory / "broker.out", "ab") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise EngineError(f"the Kafka broker exited with {self.process.returncode}; see {self.log_file}")
            try:
                topics = admin.list_topics(timeout=1).topics.values()
            except Exception:  # not listening yet
                time.sleep(0.2)
                continue
            if all(p.leader >= 0 for topic in topics for p in topic.partitions.values()):
                return  # after a restart: every partition has its leader again
            time.sleep(0.2)
        self.stop()
        raise EngineError(f"the Kafka broker did not start within {timeout:.0f} s; see {self.log_file}")

    def stop(self, graceful: bool = False) -> None:
        """Stop the broker and wait for it; idempotent. ``graceful``: SIGTERM (a controlled
        shutdown, as an operator restarts a broker) with SIGKILL after 30 s; else SIGKILL."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.process.wait(30 if graceful else None)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def restart(self, timeout: float = 60.0) -> None:
        """A controlled restart on the same ports and data."""
        self.stop(graceful=True)
        self.start(timeout)

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        """Create topic ``name`` (replication factor 1: there is one broker)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(timeout=30)

    def delete_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        admin.delete_topics([name])[name].result(timeout=30)

    def add_partitions(self, name: str, total: int) -> None:
        """Grow topic ``name`` to ``total`` partitions (as ``kafka-topics --alter --partitions``)."""
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        admin.create_partitions([NewPartitions(name, total)])[name].result(timeout=30)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
