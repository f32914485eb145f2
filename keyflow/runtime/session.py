"""One SparkSession per run, built from keyflow configuration."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from keyflow.errors import ConfigError
from keyflow.runtime import class_archive
from keyflow.runtime.errors import first_line
from keyflow.runtime.java import JavaNotFoundError, require_java

DEFAULT_MASTER = "local[*]"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_session(conf: Mapping[str, str] | None = None, app_name: str = "keyflow") -> SparkSession:
    """Start a SparkSession, or reuse the active one; ``spark.*`` keys of ``conf`` pass through.

    Spark's Python workers run this interpreter, so they import the same keyflow and
    pinned libraries as the driver. On a running session only runtime settings can change;
    static ones (``spark.master``, memory, ...) take effect when a session is first created.
    """
    settings = {key: str(value) for key, value in (conf or {}).items() if key.startswith("spark.")}
    _quiet_query_context_logs()
    active = SparkSession.getActiveSession()
    if active is not None:
        _apply_runtime_settings(active, settings)
        return active
    try:
        require_java()
    except JavaNotFoundError as error:
        raise ConfigError(str(error)) from None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.Builder().appName(app_name)  # a fresh builder: options must not leak between runs
    defaults = {
        "spark.master": DEFAULT_MASTER,
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG} {class_archive.java_options()}",
    }
    for key, value in {**defaults, **settings}.items():
        builder = builder.config(key, value)
    session = None
    try:
        session = builder.getOrCreate()
        session.catalog.currentDatabase()  # builds the SQL session state: bad spark.sql.* values fail here
    except Exception as error:
        if session is not None:
            session.stop()  # a half-built session would fail every later run too
        raise ConfigError(
            f"Spark did not start with the given spark.* settings: {first_line(str(error))}; "
            "check the spark.* keys in the pipeline config, --conf and --config"
        ) from None
    session.sparkContext.setLogLevel("FATAL")  # keyflow reports failures itself, in one line
    return session


def _apply_runtime_settings(session: SparkSession, settings: Mapping[str, str]) -> None:
    for key, value in settings.items():
        if session.conf.get(key, None) == value or not session.conf.isModifiable(key):
            continue
        try:
            session.conf.set(key, value)
        except Exception as error:
            raise ConfigError(f"{key}={value!r} was rejected by Spark: {first_line(str(error))}") from None


def _quiet_query_context_logs() -> None:
    """PySpark logs every analysis error with its full JVM stack; keyflow shows one line instead."""
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
