"""A partitioned append-only log on a filesystem: keyflow's stand-in for Kafka.

A log has N splits; each split is a sequence of records numbered from 0, stored as Arrow
IPC segment files named by their offset range (``split-0003/00000000000000000100-
00000000000000000250.arrow`` holds records 100..249). A writer appends a segment with a
write-then-rename, so a reader never sees half a segment; one writer per split.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from pyarrow import fs

from keyflow.changelog import OFFSET, OP, check_row_kinds
from keyflow.errors import PlanError, is_positive_int
from keyflow.keygroups import assign_to_key_groups
from keyflow.paths import exists, filesystem, lock_file, unlock, write_atomically
from keyflow.schemas import ColumnsDifferError, TypesDifferError, conform_to

_META = "_log.json"


class Log:
    """Open an existing log (``Log(path)``) or create one (``Log.create(path, splits, schema)``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.fs, self.root = filesystem(self.path)
        if not exists(self.fs, f"{self.root}/{_META}"):
            raise PlanError(f"{self.path} is not a keyflow log; create it with `keyflow log append {self.path} ...`")
        described = self._read_meta()
        self._described = described
        self.splits: int = described["splits"]
        self.schema: pa.Schema = ipc.read_schema(pa.py_buffer(bytes.fromhex(described["schema"])))

    @property
    def keyed_by(self) -> tuple[str, ...] | None:
        """The key every append so far split records by (a key then lives in one split, its
        changes in order): ``()`` before the first append, None once an append was not keyed
        or used another key."""
        key = self._described.get("key")
        return None if key is False else tuple(key or ())

    @staticmethod
    def create(path: str | Path, splits: int, schema: pa.Schema) -> Log:
        """A new log of ``splits`` splits; ``schema`` is adjusted to types Spark reads
        (timestamps in microseconds, ``large_string`` as ``string``, unsigned as wider signed)."""
        if not is_positive_int(splits):
            raise PlanError(f"a log needs splits >= 1, got {splits!r}")
        schema = spark_readable(schema)
        files, root = filesystem(str(path))
        files.create_dir(root, recursive=True)
        described = {"splits": splits, "schema": schema.serialize().to_pybytes().hex()}
        _write_json(files, f"{root}/{_META}", described)
        for split in range(splits):
            files.create_dir(f"{root}/split-{split:04d}", recursive=True)
        return Log(path)

    def add_splits(self, count: int) -> int:
        """Add ``count`` empty splits (as Kafka adds partitions); returns the new number of splits.

        Records already written stay in their splits. A keyed append afterwards spreads keys
        over all splits, so a key could then be in two splits: the log is no longer split by
        that key (a changelog log refuses: the order of a key's changes would be lost)."""
        if not is_positive_int(count):
            raise PlanError(f"add_splits needs a count >= 1, got {count!r}")
        if OP in self.schema.names:
            raise PlanError(
                f"changelog {self.path} cannot get more splits: the changes of a key would move to another split "
                "and lose their order; write a new log with more splits"
            )
        with self._lock():
            described = self._read_meta()
            first = described["splits"]
            for split in range(first, first + count):
                self.fs.create_dir(f"{self.root}/split-{split:04d}", recursive=True)
            described["splits"] = first + count
            if described.get("key") and any(self.end_offsets()):
                described["key"] = False
            _write_json(self.fs, f"{self.root}/{_META}", described)
            self._described, self.splits = described, first + count
        return self.splits

    def refresh(self) -> int:
        """Read the number of splits again (another process may have added some)."""
        self._described = self._read_meta()
        self.splits = self._described["splits"]
        return self.splits

    def _read_meta(self) -> dict[str, Any]:
        with self.fs.open_input_stream(f"{self.root}/{_META}") as stream:
            described: dict[str, Any] = json.loads(stream.read())
        return described

    def _segments(self, split: int) -> list[tuple[int, int, str]]:
        selector = fs.FileSelector(f"{self.root}/split-{split:04d}", allow_not_found=True)
        segments = []
        for info in self.fs.get_file_info(selector):
            if info.base_name.endswith(".arrow"):
                first, last = info.base_name[: -len(".arrow")].split("-")
                segments.append((int(first), int(last), info.path))
        return sorted(segments)

    def end_offsets(self) -> list[int]:
        """The next offset of every split (its number of records)."""
        return [segments[-1][1] if (segments := self._segments(split)) else 0 for split in range(self.splits)]

    def append(self, records: pa.Table, key: str | list[str] | None = None, split: int | None = None) -> dict[int, int]:
        """Append ``records``; with ``key`` each key goes to one split (``key group mod splits``
        of its Spark hash); with ``split`` all go to that split (a partitioner of your own);
        else rows are spread round-robin. Returns records appended per split.

        A changelog log (one with an ``op`` column) takes rows of kinds +I, -U, +U, -D; an
        upsert log takes a row per change, a row whose non-key columns are all null deleting its
        key. Either way append with ``key`` = the primary key, so the changes of a key keep their
        order in one split.

        Appends to a local log hold an exclusive lock, so concurrent writers queue; on other
        filesystems keep to one writer per log."""
        records = _conform(records, self.schema)
        names = None if key is None else ([key] if isinstance(key, str) else list(key))
        if OP in self.schema.names:
            check_row_kinds(records, f"append to changelog {self.path}")
            if names is None:
                raise PlanError(
                    f"append to changelog {self.path} needs key= (--key): the changes of a key must stay in one "
                    "split to keep their order; give the primary key"
                )
        if split is not None and names is not None:
            raise PlanError(f"append to {self.path}: give key= or split=, not both")
        with self._lock():
            self.refresh()
            if split is not None:
                if not (isinstance(split, int) and 0 <= split < self.splits):
                    raise PlanError(
                        f"append to {self.path}: split={split!r} is not one of its splits 0..{self.splits - 1}"
                    )
                splits = np.full(records.num_rows, split)
            elif names is not None:
                check_key_columns(names, self.schema)
                splits = assign_to_key_groups(records.select(names), self.splits, hash="spark")
            else:
                splits = np.arange(records.num_rows) % self.splits
            self._record_key(names)
            ends = self.end_offsets()
            appended = {}
            for target in np.unique(splits):
                part = records.filter(pa.array(splits == target))
                first = ends[int(target)]
                directory = f"{self.root}/split-{int(target):04d}"
                temporary = f"{directory}/.{first:020d}-{uuid.uuid4().hex}.tmp"
                with self.fs.open_output_stream(temporary) as stream, ipc.new_file(stream, self.schema) as writer:
                    writer.write_table(part)
                self.fs.move(temporary, f"{directory}/{first:020d}-{first + part.num_rows:020d}.arrow")
                appended[int(target)] = part.num_rows
        return appended

    def _record_key(self, names: list[str] | None) -> None:
        """Remember the key appends split by; a different or missing one unkeys the log for good
        (a changelog log refuses it: its order per key would be lost)."""
        described = self._read_meta()
        first = not any(self.end_offsets())
        recorded = described.get("key")
        key: list[str] | bool = names if names is not None and (first or recorded == names) else False
        if OP in self.schema.names and key is False:
            raise PlanError(
                f"append to changelog {self.path} with key={names} but it is split by {recorded}; append with the "
                "same key (the primary key) so the changes of a key stay in one split"
            )
        if recorded != key:
            described["key"] = key
            _write_json(self.fs, f"{self.root}/{_META}", described)
        self._described = described

    @contextmanager
    def _lock(self) -> Iterator[None]:
        handle = lock_file(f"{self.root}/_log.lock", wait=True) if isinstance(self.fs, fs.LocalFileSystem) else None
        try:
            yield
        finally:
            unlock(handle)

    def read(self, split: int, first: int, last: int, offsets: bool = False) -> Iterator[pa.RecordBatch]:
        """Records ``first..last-1`` of ``split``; with ``offsets`` each carries its offset in
        an ``__offset`` column (a changelog source orders the changes of a key by it)."""
        for start, end, path in self._segments(split):
            if end <= first or start >= last:
                continue
            with self.fs.open_input_file(path) as handle:
                table = ipc.open_file(handle).read_all()
            begin = max(first, start)
            table = table.slice(begin - start, min(last, end) - begin)
            if offsets:
                table = table.append_column(OFFSET, pa.array(np.arange(begin, begin + table.num_rows)))
            yield from table.to_batches()


def _write_json(files: fs.FileSystem, path: str, value: dict[str, object]) -> None:
    write_atomically(files, path, json.dumps(value).encode())


def check_key_columns(names: list[str], schema: pa.Schema) -> None:
    missing = [name for name in names if name not in schema.names]
    if missing:
        raise PlanError(f"key column(s) {missing} are not in the log's columns {schema.names}")


def spark_readable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each type replaced by the one Spark reads back from Arrow."""
    fields = []
    for field in schema:
        kind = field.type
        if pa.types.is_timestamp(kind):
            kind = pa.timestamp("us", tz=kind.tz)
        elif pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            kind = pa.string()
        elif pa.types.is_large_binary(kind):
            kind = pa.binary()
        elif pa.types.is_unsigned_integer(kind):
            if kind.bit_width == 64:
                raise PlanError(f"column {field.name!r} is uint64, which Spark cannot hold; cast it to int64 first")
            kind = {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[kind.bit_width]
        fields.append(field.with_type(kind))
    return pa.schema(fields)


def _conform(records: pa.Table, schema: pa.Schema) -> pa.Table:
    try:
        return conform_to(records, schema)
    except ColumnsDifferError:
        raise PlanError(f"records have columns {records.column_names}; the log's schema is {schema.names}") from None
    except TypesDifferError as error:
        raise PlanError(f"records do not fit the log's schema ({schema}): {error}") from None
