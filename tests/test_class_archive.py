"""The set-up's class archive (``keyflow/runtime/class_archive.py``): a fresh keyflow driver
loads Spark's classes from it, and says nothing about it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyflow.runtime import class_archive

START = "from keyflow.runtime.session import spark_session as s; s({'spark.master': 'local[1]'}).range(3).count()"


@pytest.mark.jvm
def test_a_fresh_driver_loads_spark_classes_from_the_archive(tmp_path: Path) -> None:
    assert class_archive.ARCHIVE.is_file(), "no class archive: scripts/bootstrap.sh makes it"
    log = tmp_path / "classes.log"
    options = f"{os.environ.get('JDK_JAVA_OPTIONS', '')} -Xlog:class+load=info:file={log}"
    run = subprocess.run(
        [sys.executable, "-c", START], env={**os.environ, "JDK_JAVA_OPTIONS": options},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    loaded = {line.split()[1]: line for line in log.read_text().splitlines() if " source: " in line}
    assert "shared objects file (top)" in loaded["org.apache.spark.SparkContext"]  # the archive's layer
    assert "cds" not in run.stdout + run.stderr  # a mismatched archive would be skipped silently
