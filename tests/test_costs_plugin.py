"""tests/costs.py itself, in a pytest run of its own: a test not marked jvm cannot start Spark
or Java, and a process a test leaves running fails the run and is killed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER = """
import os
import subprocess


def test_leaves_a_process_running():
    subprocess.Popen(["sleep", "117"])


def test_starts_spark_unmarked():
    from keyflow.runtime.session import spark_session

    spark_session({"spark.master": "local[1]"})


def test_starts_java_unmarked():
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    result = subprocess.run([java, "-XX:+PrintFlagsFinal"], capture_output=True, text=True)
    assert result.returncode == 97, result.stderr
    assert "test_starts_java_unmarked started a JVM but is not marked jvm" in result.stderr
"""


def test_unmarked_tests_start_no_jvm_and_leftovers_fail_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("KEYFLOW_TEST_LEFTOVER_GRACE", "0")
    result = pytester.runpytest_subprocess("-p", "tests.costs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*RuntimeError: *test_starts_spark_unmarked used Spark but is not marked jvm*"])
    result.stderr.fnmatch_lines(["FAILED: processes left running by the tests (killed now):", "*sleep 117*"])
    result.stdout.fnmatch_lines(["*15 slowest tests*", "all tests: 0 JVMs started, 0 SparkContexts in test processes"])
    still = subprocess.run(["pgrep", "-f", "sleep 117"], capture_output=True, text=True, check=False)
    assert still.stdout == "", still.stdout
