"""Filesystem source and sinks: Parquet, JSON lines, CSV, read and written by Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from keyflow.errors import PipelineError, PlanError
from keyflow.runtime.exchange import with_partitions

FORMATS = ("parquet", "json", "csv")
# Malformed JSON/CSV records fail the job by default instead of silently becoming nulls.
_READ_DEFAULTS = {"json": {"mode": "FAILFAST"}, "csv": {"mode": "FAILFAST", "header": "true"}, "parquet": {}}
_WRITE_DEFAULTS = {"json": {}, "csv": {"header": "true"}, "parquet": {}}


def _check_format(format: str) -> str:
    if format not in FORMATS:
        raise PlanError(f"file format {format!r} is not supported; choose one of {', '.join(FORMATS)}")
    return format


class FileSource:
    """A bounded source over a file or directory of files."""

    def __init__(self, path: str | Path, format: str, schema: str | None, options: dict[str, str]) -> None:
        self.path, self.format, self.schema = str(path), _check_format(format), schema
        self.options = {**_READ_DEFAULTS[format], **options}

    def describe(self) -> dict[str, Any]:
        described = {"connector": f"files ({self.format})", "path": self.path}
        if self.schema:
            described["schema"] = self.schema
        return described

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        if not _exists(self.path):
            raise PipelineError(f"input path {self.path} does not exist; check the path given to files(...)")
        reader = spark.read.format(self.format).options(**self.options)
        if self.schema:
            reader = reader.schema(self.schema)
        elif self.format == "csv":
            reader = reader.option("inferSchema", "true")
        return with_partitions(reader.load(spark_path(self.path)), parallelism)


def files(path: str | Path, format: str = "parquet", schema: str | None = None, **options: str) -> FileSource:
    """Read Parquet, JSON lines or CSV. ``schema`` is a DDL string (``"user string, price double"``);
    without one, Parquet uses its own and JSON/CSV are inferred. Extra ``options`` go to Spark's reader."""
    return FileSource(path, format, schema, options)


class FileSink:
    """Writes one file per subtask under a directory (replacing what was there)."""

    def __init__(self, path: str | Path, format: str, options: dict[str, str]) -> None:
        self.path, self.format = str(path), _check_format(format)
        self.options = {**_WRITE_DEFAULTS[format], **options}

    def describe(self) -> dict[str, Any]:
        return {"connector": f"files ({self.format})", "path": self.path}

    def write(self, frame: DataFrame) -> int:
        """Write ``frame`` and return the number of rows now in the output."""
        path = spark_path(self.path)
        frame.write.mode("overwrite").format(self.format).options(**self.options).save(path)
        # Read back the way it was written (header or not; quoted newlines in CSV).
        read_options = {**self.options, "multiLine": "true"} if self.format == "csv" else self.options
        reader = frame.sparkSession.read.format(self.format).options(**read_options)
        return reader.schema(frame.schema).load(path).count()


def parquet(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "parquet", options)


def json(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "json", options)


def csv(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "csv", options)


def spark_path(path: str) -> str:
    """Local relative paths resolved against this process's working directory.

    Spark's JVM keeps the working directory it started in, which need not be ours.
    """
    return path if "://" in path else str(Path(path).absolute())


def _exists(path: str) -> bool:
    if "://" in path and not path.startswith("file://"):
        return True  # remote filesystems: let Spark report a missing path
    local = Path(path.removeprefix("file://"))
    return local.exists() or any(char in path for char in "*?[")
