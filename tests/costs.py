"""What each test costs in seconds, JVMs and SparkContexts; which tests may start a JVM; what
the suite leaves running.

A pytest plugin (loaded by ``conftest.py``), in every test process (``-n`` workers too):

- **JVMs.** ``JAVA_HOME`` points at a ``java`` wrapper for the whole run, so every JVM a test
  starts, in this process or a subprocess (``keyflow run``, a standalone master, worker or
  executor), records the test's id before the real Java runs. ``java -version`` (the Java
  check) and Spark's launcher, which only prints the real command, are not counted.
- **Only tests marked ``jvm`` may start one.** For any other test the wrapper refuses to start
  Java and an in-process SparkSession is refused before it starts, with an error naming the
  marker: the check lane (``-m "not jvm"``) then proves that CLI paths failing before Spark
  never start a JVM.
- **Costs.** Each test's JVMs and SparkContexts travel on its teardown report, so the process
  that prints (the only one, or the ``-n`` controller) sums seconds, JVMs and contexts per
  test and file, prints the slowest tests and writes ``$KEYFLOW_TEST_COSTS`` (JSON) if set.
- **Leftovers.** Every process the suite starts carries ``KEYFLOW_TEST_RUN`` in its
  environment; when pytest ends, any still alive (after a grace period for JVMs that exit with
  their Python) is listed, killed, and fails the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

RUN_MARK = "KEYFLOW_TEST_RUN"
REAL_JAVA = "KEYFLOW_TEST_REAL_JAVA"
SLOWEST_SHOWN = 15
LEFTOVER_GRACE_SECONDS = float(os.environ.get("KEYFLOW_TEST_LEFTOVER_GRACE", "30"))
NOT_COUNTED = ("org.apache.spark.launcher.Main", "-version")
DENIED_IN_PROCESS = "{test} used Spark but is not marked jvm: mark it @pytest.mark.jvm, or keep it off Spark"
DENIED = (
    "{test} started a JVM but is not marked jvm: mark it @pytest.mark.jvm "
    "(or pytestmark = pytest.mark.jvm for its module), or keep it off Spark"
)

# Short-lived test JVMs spend much of their CPU compiling (C2 JIT) and in parallel GC threads;
# one C1 compiler thread and the serial collector halve it, which matters with two workers on 2 cores.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"
# The wrapper: record, refuse when the running test may not start Java, else run the real one.
_WRAPPER = """#!/bin/sh
if [ -e "$KEYFLOW_TEST_JVM_DENIED" ] && [ "$1" != "-version" ]; then
  echo "$(cat "$KEYFLOW_TEST_JVM_DENIED")" >&2
  exit 97
fi
printf '%s\\t%s\\n' "${PYTEST_CURRENT_TEST:-session}" "$*" >> "$KEYFLOW_TEST_JVM_LOG"
set -f  # the options split into words, never globbed
exec "$KEYFLOW_TEST_REAL_JAVA" $KEYFLOW_TEST_JAVA_OPTIONS "$@"
"""


class _Process:
    """This test process's wrapper, log and counters."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="keyflow-test-java-"))
        self.log = self.home / "jvms.log"
        self.denied = self.home / "denied"
        self.contexts = 0
        self.jvm_allowed = True
        self.current = ""

    def install(self, worker: bool) -> None:
        from keyflow.runtime.java import java_executable

        real = os.environ.get(REAL_JAVA) or os.path.realpath(java_executable())  # a worker inherits it
        wrapper = self.home / "bin" / "java"
        wrapper.parent.mkdir()
        wrapper.write_text(_WRAPPER)
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.log.touch()
        os.environ.update(
            {
                "JAVA_HOME": str(self.home),
                REAL_JAVA: real,
                "KEYFLOW_TEST_JVM_LOG": str(self.log),
                "KEYFLOW_TEST_JVM_DENIED": str(self.denied),
                "KEYFLOW_TEST_JAVA_OPTIONS": os.environ.get("KEYFLOW_TEST_JAVA_OPTIONS", JAVA_OPTIONS),
            }
        )
        if not worker:  # a pytest-xdist worker keeps its controller's mark
            os.environ[RUN_MARK] = uuid.uuid4().hex
        self._guard_spark_in_process()

    def _guard_spark_in_process(self) -> None:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        process = self
        start_context = SparkContext._do_init
        launch_gateway = SparkContext._ensure_initialized
        active_session = SparkSession.getActiveSession
        get_or_create = SparkSession.Builder.getOrCreate

        def counted_start(context: Any, *args: Any, **kwargs: Any) -> Any:
            process.contexts += 1
            return start_context(context, *args, **kwargs)

        def guarded_launch(*args: Any, **kwargs: Any) -> Any:
            process.refuse_unless_allowed()
            return launch_gateway(*args, **kwargs)

        def guarded_active() -> Any:
            process.refuse_unless_allowed()
            return active_session()

        def guarded_get_or_create(builder: Any) -> Any:
            process.refuse_unless_allowed()
            return get_or_create(builder)

        SparkContext._do_init = counted_start  # type: ignore[method-assign]
        SparkContext._ensure_initialized = staticmethod(guarded_launch)  # type: ignore[method-assign,assignment]
        SparkSession.getActiveSession = staticmethod(guarded_active)  # type: ignore[method-assign]
        SparkSession.Builder.getOrCreate = guarded_get_or_create  # type: ignore[method-assign]

    def refuse_unless_allowed(self) -> None:
        """Refuse Spark to the running test's thread when it is not marked ``jvm`` (a thread
        left by an earlier test, e.g. one stopping a job, is not the test's doing)."""
        if not self.jvm_allowed and threading.current_thread() is threading.main_thread():
            raise RuntimeError(DENIED_IN_PROCESS.format(test=self.current))

    def jvm_lines(self) -> int:
        return sum(1 for line in self.log.read_text().splitlines() if not _not_counted(line))

    def allow(self, item: pytest.Item) -> None:
        self.jvm_allowed = item.get_closest_marker("jvm") is not None
        self.current = item.nodeid
        if self.jvm_allowed:
            self.denied.unlink(missing_ok=True)
        else:
            self.denied.write_text(DENIED.format(test=item.nodeid))

    def allow_all(self) -> None:
        """Between tests (session set-up and teardown outside any test included)."""
        self.jvm_allowed = True
        self.denied.unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def _not_counted(line: str) -> bool:
    args = line.partition("\t")[2]
    return any(args.startswith(marker) or f" {marker} " in f" {args} " for marker in NOT_COUNTED)


class _Totals:
    """Per test: seconds (setup + call + teardown), JVMs started, SparkContexts started."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tests: dict[str, dict[str, float]] = defaultdict(lambda: {"seconds": 0.0, "jvms": 0, "spark_contexts": 0})

    def add(self, report: pytest.TestReport) -> None:
        row = self.tests[report.nodeid]
        row["seconds"] += report.duration
        for key, value in report.user_properties:
            if key == "keyflow_costs":
                row["jvms"] += value["jvms"]
                row["spark_contexts"] += value["spark_contexts"]

    def report(self) -> dict[str, Any]:
        files: dict[str, dict[str, float]] = defaultdict(
            lambda: {"tests": 0, "seconds": 0.0, "jvms": 0, "spark_contexts": 0}
        )
        for test, row in self.tests.items():
            total = files[test.split("::", 1)[0]]
            total["tests"] += 1
            for key in ("seconds", "jvms", "spark_contexts"):
                total[key] += row[key]
        rounded = {name: {**row, "seconds": round(row["seconds"], 2)} for name, row in self.tests.items()}
        return {
            "wall_seconds": round(time.monotonic() - self.started, 1),
            "files": {name: {**row, "seconds": round(row["seconds"], 1)} for name, row in sorted(files.items())},
            "tests": rounded,
        }


_process = _Process()
_totals = _Totals()


def jvm_starts() -> int:
    """JVMs started so far by this test process and its subprocesses (for tests that prove a
    command starts none)."""
    return _process.jvm_lines()


_SESSION = pytest.StashKey[pytest.Session]()


def pytest_configure(config: pytest.Config) -> None:
    _process.install(worker=hasattr(config, "workerinput"))


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION] = session


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    _process.allow(item)
    item.stash[_BEFORE] = (_process.jvm_lines(), _process.contexts)
    try:
        return (yield)
    finally:
        _process.allow_all()


_BEFORE = pytest.StashKey[tuple[int, int]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if call.when == "teardown":
        jvms, contexts = item.stash[_BEFORE]
        costs = {"jvms": _process.jvm_lines() - jvms, "spark_contexts": _process.contexts - contexts}
        report.user_properties.append(("keyflow_costs", costs))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _totals.add(report)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    report = _totals.report()
    target = os.environ.get("KEYFLOW_TEST_COSTS")
    if target:
        Path(target).write_text(json.dumps(report, indent=1))
    slowest = sorted(report["tests"].items(), key=lambda item: -item[1]["seconds"])[:SLOWEST_SHOWN]
    terminalreporter.section(f"{SLOWEST_SHOWN} slowest tests (seconds, JVMs started, SparkContexts in-process)")
    for test, cost in slowest:
        line = f"{cost['seconds']:8.1f} s {cost['jvms']:3d} JVM {cost['spark_contexts']:2d} ctx  {test}"
        terminalreporter.write_line(line)
    totals = report["files"].values()
    jvms, contexts = sum(row["jvms"] for row in totals), sum(row["spark_contexts"] for row in totals)
    terminalreporter.write_line(f"all tests: {jvms} JVMs started, {contexts} SparkContexts in test processes")


def pytest_unconfigure(config: pytest.Config) -> None:
    """After every worker ended: fail the run on processes a test left running."""
    _process.remove()
    if hasattr(config, "workerinput") or _SESSION not in config.stash:
        return
    left = _leftovers(os.environ[RUN_MARK], _own_gateway())
    deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
    while left and time.monotonic() < deadline:
        time.sleep(1)  # a test process's own JVM exits once that process has
        left = _leftovers(os.environ[RUN_MARK], _own_gateway())
    if not left:
        return
    print("\nFAILED: processes left running by the tests (killed now):", file=sys.stderr)
    for pid, command in left.items():
        print(f"  {pid}: {command[:200]}", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    session = config.stash[_SESSION]
    if session.exitstatus == pytest.ExitCode.OK:  # an interrupt or error keeps its own status
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _own_gateway() -> int | None:
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    return process.pid if process is not None else None


def _leftovers(run_id: str, own_jvm: int | None) -> dict[int, str]:
    """Live processes carrying this run's mark, except this one and its own JVM's tree (which
    ends when this process exits)."""
    mark = f"{RUN_MARK}={run_id}".encode()
    parents: dict[int, int] = {}
    marked: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            if fields[0] == "Z" or mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue  # a zombie runs nothing
            marked[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile

    def in_own_spark(pid: int) -> bool:
        while pid > 1:
            if pid == own_jvm:
                return True
            pid = parents.get(pid, 0)
        return False

    ancestors = set()
    pid = os.getpid()
    while pid > 1:
        ancestors.add(pid)
        pid = parents.get(pid, 0)
    return {pid: command for pid, command in marked.items() if pid not in ancestors and not in_own_spark(pid)}
