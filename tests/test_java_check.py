"""The Java check names what it found and how to fix it, before Spark is ever started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyflow.runtime import java


def fake_java_home(tmp_path: Path, version_line: str) -> Path:
    """A JAVA_HOME whose bin/java prints the given `java -version` line, like old JDKs do."""
    binary = tmp_path / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    binary.chmod(0o755)
    return tmp_path


def test_real_java_is_17_or_newer() -> None:
    executable = java.require_java()
    assert java.java_major_version(executable) >= 17


def test_java_8_is_rejected_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java_home(tmp_path, 'java version "1.8.0_392"')))
    with pytest.raises(java.JavaNotFoundError, match=r"is Java 8; keyflow needs Java 17 or newer: install"):
        java.require_java()


def test_java_11_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java_home(tmp_path, 'openjdk version "11.0.2" 2019-01-15')))
    with pytest.raises(java.JavaNotFoundError, match="is Java 11"):
        java.require_java()


def test_missing_java_home_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(
        java.JavaNotFoundError, match=r"no java executable found via JAVA_HOME=.*nowhere.*apt-get install"
    ):
        java.require_java()


def test_script_form_exits_1_with_message(tmp_path: Path) -> None:
    """The Makefile runs the module as a plain script before any dependency is installed."""
    env = {"JAVA_HOME": str(tmp_path / "missing"), "PATH": "/usr/bin:/bin"}
    script = Path(java.__file__)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 1
    assert "error: no java executable found" in result.stderr


def test_a_session_without_java_is_one_config_error(tmp_path: Path) -> None:
    """Starting Spark without Java is a KeyflowError naming the fix (the CLI prints one line)."""
    check = (
        "from keyflow.errors import ConfigError\n"
        "from keyflow.runtime.session import spark_session\n"
        "try:\n    spark_session({'spark.master': 'local[1]'})\n"
        "except ConfigError as error:\n    print('ConfigError:', error)\n"
    )
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "nowhere")}
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, check=False)
    assert result.stdout.startswith("ConfigError: no java executable found via JAVA_HOME="), result.stderr
    assert "apt-get install" in result.stdout
