"""The state-file store: the Parquet files keyed subtasks write, one per subtask and version,
named by their key-group range and checksum, each row carrying its key group.

A file holds the keys one subtask changed in one version (``delta``) or all keys of its
key-group range (``full``, written by compaction). Files are listed in the manifest with
their key-group range, so any range can be restored from files written at any parallelism.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from keyflow.errors import DamagedFileError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.state.assignment import StateFile, base_versions, files_to_read
from keyflow.state.memory import KeyedStateStore
from keyflow.state.seal import checksum

if TYPE_CHECKING:
    from keyflow.state.checkpoint import Checkpoint

ALTERED = "was altered: its content does not match the checksum recorded when written"
PARTS, PART_ROWS = 8, 16_384  # a state file of more than PART_ROWS rows is cut into PARTS row groups by key group
KEYS_METADATA = b"keyflow.keys_in_range"
KEY_REPORT = "keys"  # a pre-keyed subtask's keys to check, next to its state file


class StateFileStore:
    """Where a checkpoint's subtasks write their state: ``state/op-<uid>/v-<version>/``."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def version_dir(self, uid: str, version: int) -> str:
        return f"state/{operator_dir(uid)}/v-{version:010d}"

    def newest(self, written: Iterable[StateFile]) -> list[StateFile]:
        """The files the subtasks reported for one version, in the order their tasks finished
        (Spark merges accumulators so), by key-group range: where two attempts of a subtask
        both finished (a retried or recomputed task), the later file is kept and the other
        deleted. Reports, not a listing: on an object store a listing per micro-batch is slow
        and billed."""
        newest: dict[tuple[str, int, int], StateFile] = {}
        for file in written:
            replaced = newest.pop((file.kind, file.first, file.last), None)
            if replaced is not None and replaced.path != file.path:
                self.checkpoint.fs.delete_file(self.checkpoint.path(replaced.path))
            newest[(file.kind, file.first, file.last)] = file
        return sorted(newest.values(), key=lambda file: file.first)

    def dirs_after(self, version: int | None) -> list[str]:
        """The state directories (relative) of versions after ``version`` (None: all)."""
        found = []
        listing = fs.FileSelector(self.checkpoint.path("state"), allow_not_found=True)
        for uid_dir in self.checkpoint.fs.get_file_info(listing):
            if uid_dir.type != fs.FileType.Directory:
                continue
            for version_dir in self.checkpoint.fs.get_file_info(fs.FileSelector(uid_dir.path, allow_not_found=True)):
                written = version_dir.base_name.removeprefix("v-")
                if written.isdigit() and (version is None or int(written) > version):
                    found.append(f"state/{uid_dir.base_name}/{version_dir.base_name}")
        return sorted(found)

    def discard_after(self, version: int | None) -> None:
        """Remove state written for versions after ``version`` that were never committed."""
        for directory in self.dirs_after(version):
            self.checkpoint.fs.delete_dir(self.checkpoint.path(directory))


def operator_dir(uid: str) -> str:
    """The directory of an operator's state: ``op-<uid>``, where a uid with characters that
    are not safe in paths on every filesystem (HDFS refuses ':'; macOS and Windows ignore
    case) has them replaced and a hash of the uid added, so distinct uids never share one."""
    safe = re.sub(r"[^a-z0-9_.-]", "_", uid.lower())
    return f"op-{safe}" if safe == uid else f"op-{safe}-{hashlib.sha1(uid.encode()).hexdigest()[:8]}"


def version_of(relative: str) -> int:
    """The version a file under ``state/`` was written for."""
    part = next(p for p in relative.split("/") if p.startswith("v-"))
    return int(part.removeprefix("v-"))


def state_file_name(kind: str, first: int, last: int, digest: str) -> str:
    return f"{kind}-{first:05d}-{last:05d}.{digest}.parquet"


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as LZ4-compressed Parquet. Keys are unique in every file keyflow writes, so
    dictionary encoding and statistics go to the key-group column only: on other columns
    they cost 3-5x the time of the whole write and save nothing (measured in
    docs/benchmarks.md). A file of more than ``PART_ROWS`` rows is sorted by key group and cut
    into ``PARTS`` row groups, so a subtask of another parallelism reads about its share of
    it (:func:`read_part`); every page carries Parquet's CRC, which checks a partial read."""
    sink = pa.BufferOutputStream()
    dictionary = [KEY_GROUP_COLUMN] if KEY_GROUP_COLUMN in table.column_names else False
    rows = 256 * 1024
    if dictionary and table.num_rows > PART_ROWS:
        key_groups = table.column(KEY_GROUP_COLUMN)
        if not pc.all(pc.less_equal(key_groups[:-1], key_groups[1:])).as_py():
            table = table.sort_by(KEY_GROUP_COLUMN)
        rows = -(-table.num_rows // PARTS)
    pq.write_table(table, sink, compression="lz4", row_group_size=rows, use_dictionary=dictionary,
                   write_statistics=dictionary, write_page_checksum=True)  # fmt: skip
    return bytes(sink.getvalue().to_pybytes())


def write_state_file(
    checkpoint: Checkpoint, uid: str, version: int, kind: str, first: int, last: int, table: pa.Table, keys: int
) -> StateFile:
    """One subtask's state for one version, atomic, named by its checksum (the driver keeps the
    newest file of a subtask that a retried task wrote twice); returns what the manifest lists."""
    data = parquet_bytes(table.replace_schema_metadata({KEYS_METADATA: str(keys).encode()}))
    digest = checksum(data)
    relative = f"{checkpoint.state_files.version_dir(uid, version)}/{state_file_name(kind, first, last, digest)}"
    checkpoint.write_atomically(relative, data)
    return StateFile(relative, kind, version, first, last, table.num_rows, keys, len(data), digest,
                     checksum(data[-_footer_length(data[-8:]) :]))  # fmt: skip


def write_key_report(checkpoint: Checkpoint, uid: str, version: int, first: int, last: int, keys: pa.Table) -> str:
    """A pre-keyed subtask's keys to check for version ``version`` (see ``keyflow.state.splits``);
    its path, which the subtask reports to the driver (a retried task writes the same path)."""
    relative = f"{checkpoint.state_files.version_dir(uid, version)}/{KEY_REPORT}-{first:05d}-{last:05d}.parquet"
    write_table(checkpoint, relative, keys)
    return relative


def truncated(found: int, recorded: int) -> str:
    return f"is truncated or overwritten: {found} bytes, the manifest recorded {recorded}"


def write_table(checkpoint: Checkpoint, relative: str, table: pa.Table) -> tuple[int, str]:
    """Write ``table`` as Parquet; its size and checksum, for the manifest."""
    data = parquet_bytes(table)
    checkpoint.write_atomically(relative, data)
    return len(data), checksum(data)


def read_table(checkpoint: Checkpoint, relative: str, size: int | None = None, digest: str | None = None) -> pa.Table:
    """Read a Parquet file of the checkpoint, checking the size and checksum the manifest
    recorded for it (DamagedFileError naming the file if they differ or it is missing)."""
    try:
        with checkpoint.fs.open_input_file(checkpoint.path(relative)) as handle:
            data = handle.read()
    except FileNotFoundError:
        raise DamagedFileError(relative, "is missing") from None
    if size is not None and len(data) != size:
        raise DamagedFileError(relative, truncated(len(data), size))
    if digest is not None and checksum(data) != digest:
        raise DamagedFileError(relative, ALTERED)
    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as error:
        raise DamagedFileError(relative, f"is not readable Parquet ({error})") from None


def read_part(checkpoint: Checkpoint, f: StateFile, first: int, last: int) -> pa.Table:
    """The row groups of ``f`` that may hold key groups ``first..last`` (by their statistics):
    the footer checked against the checksum the manifest recorded, every page read against its
    CRC. A file that was not cut (small, or with no recorded footer checksum), or whose row
    groups all overlap, is read whole and checked against its checksum. The bytes are fetched before anything is parsed,
    so a failing store is a storage error, never damage."""
    if f.footer is None or f.rows <= PART_ROWS:  # not cut (one row group): nothing to skip
        return read_table(checkpoint, f.path, f.bytes, f.checksum)
    try:
        handle = checkpoint.fs.open_input_file(checkpoint.path(f.path))
    except FileNotFoundError:
        raise DamagedFileError(f.path, "is missing") from None
    with handle:
        size = handle.size()
        if f.bytes is not None and size != f.bytes:
            raise DamagedFileError(f.path, truncated(size, f.bytes))
        length = _footer_length(handle.read_at(8, size - 8)) if size >= 8 else size + 1
        footer = handle.read_at(length, size - length) if length <= size else b""
        if checksum(footer) != f.footer:
            raise DamagedFileError(f.path, ALTERED)
        sparse = bytearray(size)
        sparse[size - len(footer) :] = footer
        try:
            metadata = pq.ParquetFile(pa.BufferReader(bytes(sparse))).metadata
            wanted = _row_groups(metadata, first, last)
        except (pa.ArrowInvalid, OSError) as error:
            raise DamagedFileError(f.path, f"is not readable Parquet ({error})") from None
        if len(wanted) == metadata.num_row_groups:
            return read_table(checkpoint, f.path, f.bytes, f.checksum)
        for start, length in _chunks(metadata, wanted):
            sparse[start : start + length] = handle.read_at(length, start)
    try:
        return pq.ParquetFile(pa.BufferReader(bytes(sparse)), page_checksum_verification=True).read_row_groups(wanted)
    except (pa.ArrowInvalid, OSError) as error:
        raise DamagedFileError(
            f.path, ALTERED if "CRC" in str(error) else f"is not readable Parquet ({error})"
        ) from None


def _footer_length(last_eight: bytes) -> int:
    """The length of a Parquet footer (metadata, its length, the magic) from a file's last 8 bytes."""
    return int.from_bytes(last_eight[:4], "little") + 8


def _chunks(metadata: pq.FileMetaData, row_groups: list[int]) -> list[tuple[int, int]]:
    """Byte ranges (start, length) of every column chunk of ``row_groups``."""
    ranges = []
    for index in row_groups:
        group = metadata.row_group(index)
        for column in range(group.num_columns):
            chunk = group.column(column)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            ranges.append((start, chunk.total_compressed_size))
    return ranges


def _row_groups(metadata: pq.FileMetaData, first: int, last: int) -> list[int]:
    wanted = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        column = next(c for c in range(group.num_columns) if group.column(c).path_in_schema == KEY_GROUP_COLUMN)
        statistics = group.column(column).statistics
        if statistics is None or not statistics.has_min_max or (statistics.min <= last and statistics.max >= first):
            wanted.append(index)
    return wanted


def restore(
    checkpoint: Checkpoint,
    files: list[StateFile],
    first: int,
    last: int,
    store: KeyedStateStore,
    max_parallelism: int,
    after_version: int = -1,
) -> None:
    """Load key groups ``first..last`` into ``store``: the newest full file of each key group
    and the deltas after it, oldest first (later rows of a key win). With ``after_version``,
    only changes newer than it (catching up a store that already holds that version)."""
    base = base_versions(files, max_parallelism)
    for f in files_to_read(files, first, last, after_version):
        table = read_range(checkpoint, f, first, last)
        key_groups = table.column(KEY_GROUP_COLUMN).to_numpy()
        current = base[key_groups]
        keep = (f.version > current) | ((f.version == current) & (f.kind == "full"))
        if not keep.all():
            table = table.filter(pa.array(keep))
        store.upsert(table)
    store.take_touched()


def read_range(checkpoint: Checkpoint, f: StateFile, first: int, last: int) -> pa.Table:
    """The rows of key groups ``first..last`` in ``f``, read as a restore reads them."""
    if first <= f.first and f.last <= last:
        return read_table(checkpoint, f.path, f.bytes, f.checksum)
    table = read_part(checkpoint, f, first, last)
    key_groups = table.column(KEY_GROUP_COLUMN)
    return table.filter(pc.and_(pc.greater_equal(key_groups, first), pc.less_equal(key_groups, last)))
