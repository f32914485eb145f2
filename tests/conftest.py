"""One SparkSession per test process, shared by every test marked ``jvm``; what a test changes
in it (runtime confs, temporary views, streaming queries and their listeners, the current
database) is put back after the test. See docs/testing.md."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from keyflow.runtime.kafka_broker import LocalBroker
from keyflow.runtime.session import spark_session

# Every JVM the tests start (in process, job subprocesses, standalone clusters) is short-lived
# and runs little data: the C1 compiler alone and the serial collector start faster than
# C2's warm-up pays back (the kill -9 restarts of test_exactly_once: 150 s against 238 s, measured with five).
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

pytest_plugins = ["tests.costs", "pytester"]

# The files that run longest start first, so that the two workers of make test end together
# (with --dist loadfile a file runs in one worker; seconds per file: docs/testing.md).
LONGEST_FIRST = (
    "test_cluster_faults.py",
    "test_exactly_once.py",
    "test_changelog.py",
    "test_pre_keyed.py",
    "test_kafka.py",
    "test_nexmark.py",
    "test_cli_pipelines.py",
    "test_cli_streaming.py",
    "test_damaged_checkpoints.py",
)
SESSION_CONF = {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "4"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The test process's one local Spark with two cores, stopped when pytest ends."""
    return spark_session(SESSION_CONF, app_name="keyflow-tests")


@pytest.fixture(scope="module")
def kafka_broker() -> Iterator[LocalBroker]:
    """A real Kafka broker (KRaft, one node) on loopback for the tests of one module, always
    stopped after them: an idle broker's threads would take CPU from the rest of the suite."""
    with LocalBroker(heap="384m") as broker:
        yield broker


def pytest_sessionfinish(session: pytest.Session) -> None:
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()


@pytest.fixture(autouse=True)
def _spark_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("jvm") is None:
        yield
        return
    session: SparkSession = request.getfixturevalue("spark")
    if session.sparkContext._jsc is None:
        pytest.fail("an earlier test stopped the shared SparkSession; tests must not stop it (docs/testing.md)")
    before = _SessionState.of(session)
    yield
    if session.sparkContext._jsc is None:
        return  # stopped by this test: the next jvm test fails, naming why
    left_running = before.restore(session)
    if left_running:
        pytest.fail(f"{request.node.nodeid} left streaming queries running (stopped now): {left_running}")


class _SessionState:
    """What a test may change in the shared session, taken before it runs."""

    def __init__(self, conf: dict[str, str], views: set[str], listeners: set[str], database: str) -> None:
        self.conf, self.views, self.listeners, self.database = conf, views, listeners, database

    @classmethod
    def of(cls, session: SparkSession) -> _SessionState:
        return cls(
            dict(session.conf.getAll), _temp_views(session), _listeners(session), session.catalog.currentDatabase()
        )

    def restore(self, session: SparkSession) -> list[str]:
        """Put the session back; returns the streaming queries that were still running."""
        running = [query.name or query.id for query in session.streams.active]
        for query in session.streams.active:
            query.stop()
        conf = dict(session.conf.getAll)
        for key, value in conf.items():
            if key not in self.conf and session.conf.isModifiable(key):
                session.conf.unset(key)
            elif key in self.conf and value != self.conf[key] and session.conf.isModifiable(key):
                session.conf.set(key, self.conf[key])
        for key in self.conf.keys() - conf.keys():
            if session.conf.isModifiable(key):
                session.conf.set(key, self.conf[key])
        for view in _temp_views(session) - self.views:
            session.catalog.dropTempView(view)
        manager = session._jsparkSession.streams()
        for listener in manager.listListeners():
            if listener.toString() not in self.listeners:
                manager.removeListener(listener)
        session.catalog.setCurrentDatabase(self.database)
        return running


def _temp_views(session: SparkSession) -> set[str]:
    return {table.name for table in session.catalog.listTables() if table.isTemporary}


def _listeners(session: SparkSession) -> set[str]:
    return {listener.toString() for listener in session._jsparkSession.streams().listListeners()}
