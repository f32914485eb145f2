"""One SparkSession per run, built from keyflow configuration."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from keyflow.runtime.java import require_java

DEFAULT_MASTER = "local[*]"


def spark_session(conf: Mapping[str, str] | None = None, app_name: str = "keyflow") -> SparkSession:
    """Start (or reuse) a SparkSession; ``spark.*`` keys of ``conf`` pass straight through.

    Spark's Python workers run this interpreter, so they import the same keyflow and
    pinned libraries as the driver.
    """
    require_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = {"spark.master": DEFAULT_MASTER, "spark.ui.showConsoleProgress": "false"}
    settings.update({key: str(value) for key, value in (conf or {}).items() if key.startswith("spark.")})
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("FATAL")  # keyflow reports failures itself, in one line
    return session
