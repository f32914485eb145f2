"""Filesystem source and sinks: Parquet, JSON lines, CSV, read and written by Spark."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pyarrow import fs
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from keyflow.connectors.base import Moves
from keyflow.connectors.partition_commit import PartitionCommit
from keyflow.errors import DataError, PlanError
from keyflow.paths import absolute, exists, filesystem, is_uri
from keyflow.schemas import Type, schema_columns

FORMATS = ("parquet", "json", "csv")
# Malformed JSON/CSV records fail the job by default instead of silently becoming nulls.
_READ_DEFAULTS = {"json": {"mode": "FAILFAST"}, "csv": {"mode": "FAILFAST", "header": "true"}, "parquet": {}}
_WRITE_DEFAULTS = {"json": {}, "csv": {"header": "true"}, "parquet": {}}


def _check_format(format: str) -> str:
    if format not in FORMATS:
        raise PlanError(f"file format {format!r} is not supported; choose one of {', '.join(FORMATS)}")
    return format


class FileSource:
    """Files of a directory: read once (bounded), or watched for new files (``watch=True``)."""

    def __init__(
        self, path: str | Path, format: str, schema: str | None, options: dict[str, str], watch: bool = False
    ) -> None:
        self.path, self.format, self.schema = str(path), _check_format(format), schema
        self.options = {**_READ_DEFAULTS[format], **options}
        self.unbounded = watch

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"connector": f"files ({self.format})", "path": self.path}
        if self.unbounded:
            described["watch"] = True
        if self.schema:
            described["schema"] = self.schema
        return described

    def declared_types(self) -> dict[str, Type]:
        """The declared schema's columns; Spark may add partition columns (``dt=...``) to them."""
        return (schema_columns(self.schema) if self.schema else None) or {}

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        if not _exists(self.path):
            raise DataError(f"input path {self.path} does not exist; check the path given to files(...)")
        reader = spark.read.format(self.format).options(**self.options)
        if self.schema:
            reader = reader.schema(self.schema)
        elif self.format == "csv":
            reader = reader.option("inferSchema", "true")
        return _with_partitions(reader.load(absolute(self.path)), parallelism)

    def read_stream(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """New files become new data; the schema comes from ``schema`` or the files there now."""
        schema = self.schema
        if not schema:
            files, root = filesystem(absolute(self.path))
            found = files.get_file_info(fs.FileSelector(root, allow_not_found=True))
            if not any(info.base_name[:1] not in "_." for info in found):
                raise DataError(
                    f"watched directory {self.path} has no files to take the schema from; "
                    "pass files(..., schema='col type, ...')"
                )
            schema = self.read(spark, 1).schema
        reader = spark.readStream.format(self.format).options(**self.options).schema(schema)
        return reader.load(absolute(self.path))


def files(
    path: str | Path, format: str = "parquet", schema: str | None = None, watch: bool = False, **options: str
) -> FileSource:
    """Read Parquet, JSON lines or CSV. ``schema`` is a DDL string (``"user string, price double"``);
    without one, Parquet uses its own and JSON/CSV are inferred. With ``watch=True`` the
    directory is a stream: files added later are new data (``maxFilesPerTrigger=N`` caps a
    micro-batch). Extra ``options`` go to Spark's reader."""
    return FileSource(path, format, schema, options, watch)


class FileSink:
    """Writes one file per subtask under a directory (replacing what was there); with
    ``partition_by``, under Hive-style partition directories (``dt=…/hm=…``), which ``commit``
    (Flink's partition commit) marks complete."""

    def __init__(
        self,
        path: str | Path,
        format: str,
        options: dict[str, str],
        partition_by: tuple[str, ...] = (),
        commit: PartitionCommit | None = None,
    ) -> None:
        self.path, self.format = str(path), _check_format(format)
        self.options = {**_WRITE_DEFAULTS[format], **options}
        self.partition_by, self.partition_commit = partition_by, commit

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"connector": f"files ({self.format})", "path": self.path}
        if self.partition_by:
            described["partitioned by"] = list(self.partition_by)
        return described

    def _writer(self, frame: DataFrame) -> Any:
        return frame.write.mode("overwrite").format(self.format).options(**self.options).partitionBy(
            *self.partition_by)  # fmt: skip

    def write(self, frame: DataFrame) -> int:
        """Write ``frame`` and return the number of rows now in the output; a bounded run's end
        commits every partition (as Flink's batch sink does)."""
        path = absolute(self.path)
        self._writer(frame).save(path)
        if self.partition_commit is not None:
            files, root = filesystem(path)
            written = [_relative(info.path, root) for info in _part_files(files, root)]
            self.commit_partitions(sorted({name.rsplit("/", 1)[0] for name in written}))
        # Read back the way it was written (header or not; quoted newlines in CSV).
        read_options = {**self.options, "multiLine": "true"} if self.format == "csv" else self.options
        reader = frame.sparkSession.read.format(self.format).options(**read_options)
        return reader.schema(frame.schema).load(path).count()

    def partitions(self, moves: Moves) -> list[str]:
        """The partition directories (relative to the output) that ``moves`` write to."""
        root = filesystem(absolute(self.path))[1]
        return sorted({_relative(target, root).rsplit("/", 1)[0] for _, target in moves})

    def commit_partitions(self, partitions: list[str]) -> None:
        """Flink's ``success-file`` policy: an empty success file in each partition (idempotent)."""
        if self.partition_commit is None:
            return
        files, root = filesystem(absolute(self.path))
        for partition in partitions:
            with files.open_output_stream(f"{root}/{partition}/{self.partition_commit.success_file}"):
                pass

    def reset(self) -> None:
        """A new streaming run starts from an empty output directory (like a batch overwrite)."""
        files, root = filesystem(absolute(self.path))
        if exists(files, root):
            files.delete_dir_contents(root)

    def withdraw_commits(self, pending: list[str]) -> None:
        """After a restore discarded later batches' files: no success file in a partition
        that is ``pending`` as of the checkpoint, or that has no data left."""
        if self.partition_commit is None:
            return
        files, root = filesystem(absolute(self.path))
        with_data = {_relative(info.path, root).rsplit("/", 1)[0] for info in _part_files(files, root)}
        for info in files.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True)):
            partition, _, name = _relative(info.path, root).rpartition("/")
            if (
                name == self.partition_commit.success_file
                and partition
                and (partition in pending or partition not in with_data)
            ):
                files.delete_file(info.path)

    def discard_after(self, batch: int) -> None:
        """Remove published output of batches after ``batch`` (the checkpoint does not have them)."""
        files, root = filesystem(absolute(self.path))
        for info in _part_files(files, root):
            name = info.base_name
            if name.startswith("part-b") and name[6:16].isdigit() and int(name[6:16]) > batch:
                files.delete_file(info.path)

    def stage(self, frame: DataFrame, batch: int) -> tuple[int, Moves]:
        """Write one micro-batch under a staging directory (readers skip ``_`` names) and
        return its row count and the moves that publish it once the checkpoint commits.
        A replayed batch overwrites its own staging directory, so publishing is idempotent."""
        staging = absolute(f"{self.path}/{STAGING}/batch-{batch:010d}")
        rows = counted_write(frame, lambda observed: self._writer(observed).save(staging))
        files, root = filesystem(staging)
        final = filesystem(absolute(self.path))[1]
        parts = sorted(_relative(info.path, root) for info in _part_files(files, root))
        if not parts:  # a partitioned write of no rows writes no file
            files.delete_dir(root)
        moves = []
        for number, name in enumerate(parts):
            directory, _, file = name.rpartition("/")
            target = f"part-b{batch:010d}-{number:05d}{file[file.index('.') :]}"
            moves.append([f"{root}/{name}", f"{final}/{directory}/{target}" if directory else f"{final}/{target}"])
        return rows, moves

    def publish(self, moves: Moves) -> None:
        """Move staged files into place; files already moved are skipped (safe to repeat)."""
        for source, target in moves:
            files, source_path = filesystem(source)
            if exists(files, source_path):
                target_path = filesystem(target)[1]
                files.create_dir(target_path.rsplit("/", 1)[0], recursive=True)  # a new partition's directory
                files.move(source_path, target_path)
        for directory in {_staged_batch(source) for source, _ in moves}:
            files, path = filesystem(directory)
            if exists(files, path):
                files.delete_dir(path)


STAGING = "_keyflow_staging"
_STAGED_BATCH = re.compile(rf".*/{STAGING}/batch-\d{{10}}")


def _staged_batch(source: str) -> str:
    """The staging directory of one micro-batch that ``source`` (a staged file) is in."""
    found = _STAGED_BATCH.match(source)
    return found.group(0) if found else source.rsplit("/", 1)[0]


def _part_files(files: fs.FileSystem, root: str) -> list[fs.FileInfo]:
    """The data files under ``root``, in partition directories too (not ``_``/``.`` names)."""
    found = files.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    return [
        info for info in found
        if info.type == fs.FileType.File and info.base_name.startswith("part-")
        and not any(part[:1] in "_." for part in _relative(info.path, root).split("/"))
    ]  # fmt: skip


def _relative(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1 :]


def counted_write(frame: DataFrame, write: Any) -> int:
    """Run ``write`` on ``frame`` and return how many rows it wrote (counted on the way)."""
    observation = Observation()
    write(frame.observe(observation, F.count(F.lit(1)).alias("rows")))
    return int(observation.get["rows"])


def parquet(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "parquet", options)


def json(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "json", options)


def csv(path: str | Path, **options: str) -> FileSink:
    return FileSink(path, "csv", options)


def _exists(path: str) -> bool:
    if is_uri(path) and not path.startswith("file://"):
        return True  # remote filesystems: let Spark report a missing path
    local = Path(path.removeprefix("file://"))
    return local.exists() or any(char in path for char in "*?[")


def _with_partitions(frame: DataFrame, parallelism: int) -> DataFrame:
    """Exactly ``parallelism`` partitions (the source contract): coalesce if more (no
    shuffle), spread round robin if fewer."""
    current = frame.rdd.getNumPartitions()
    if current == parallelism:
        return frame
    return frame.coalesce(parallelism) if current > parallelism else frame.repartition(parallelism)
