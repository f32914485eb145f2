"""Checkpoints: keyed state in key-group-indexed files, versioned, with an atomic manifest.

Layout under the checkpoint directory (any ``pyarrow.fs`` filesystem)::

    plan.json                      the plan of the first run: K, key hash, operators
    manifests/0000000007.json      one per committed version; written last, atomically
    state/op-3/v-0000000007/delta-00000-13859.5c3a0f1e9b2d4e67.parquet
    events.jsonl                   rescales, restores and rollbacks
    rollback.json                  only while a rollback is applied (a start refuses until it is finished)
    scheduler.jsonl                the adaptive scheduler's slots and decisions (if it runs)
    source/                        Spark's own offsets for the streaming source

A state file holds the keys one subtask changed in one version (``delta``) or all keys
of its key-group range (``full``, written by compaction), sorted by nothing in
particular: rows carry their key group, and files are listed in the manifest with their
key-group range, so any range can be restored from files written at any parallelism.
A state file's name ends in the checksum of its bytes; manifests and plan.json carry their
own (see ``keyflow.state.seal`` and ``keyflow.state.integrity``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs

from keyflow.errors import CheckpointError, DamagedFileError, KeyflowError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.paths import absolute, exists, filesystem, lock_file, write_atomically
from keyflow.state.assignment import StateFile, base_versions, files_to_read
from keyflow.state.memory import KeyedStateStore
from keyflow.state.seal import UnsealedError, checksum, seal, unseal

FORMAT_VERSION = 2  # 2: sealed manifests with checksums; 1 is still read (nothing to check)
LOCK_FILE = ".keyflow.lock"
SOURCE_DIR = "source"  # Spark's offsets and commits for the streaming source
ROLLBACK_FILE = "rollback.json"  # present while a rollback is being applied
ALTERED = "was altered: its content does not match the checksum recorded when written"
KEYS_METADATA = b"keyflow.keys_in_range"
KEY_REPORT = "keys"  # a pre-keyed subtask's keys to check, next to its state file


@dataclass
class Manifest:
    """What one committed version consists of."""

    version: int
    parallelism: int
    max_parallelism: int
    operators: dict[str, list[StateFile]]
    sinks: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    # A pre-keyed source: {"splits": [key group of each split],
    #                      "index": {uid: [[index file, rows, bytes, checksum]]}}
    pre_keyed: dict[str, Any] = field(default_factory=dict)
    checkpoint_id: str = ""  # plan.json's: a manifest copied from another checkpoint is told apart
    plan: dict[str, Any] = field(default_factory=dict)  # plan.json's content at commit, to restore a lost one

    def files(self) -> list[str]:
        """Every file of the checkpoint this version needs: state files and split indexes."""
        return list(self.needed())

    def needed(self) -> dict[str, tuple[int | None, str | None]]:
        """Every file this version needs, with its size and checksum (None: not recorded, as in
        format 1)."""
        needed: dict[str, tuple[int | None, str | None]] = {
            f.path: (f.bytes, f.checksum) for files in self.operators.values() for f in files
        }
        for files in self.pre_keyed.get("index", {}).values():
            for path, _, *recorded in files:
                needed[path] = (recorded[0], recorded[1]) if recorded else (None, None)
        return needed

    def to_json(self) -> str:
        return seal({"format_version": FORMAT_VERSION, **asdict(self)})

    @staticmethod
    def from_json(text: str, relative: str) -> Manifest:
        """Raises DamagedFileError (torn, altered, of another version) or CheckpointError (format)."""
        try:
            data = unseal(text, sealed=False)
            format_version = data.pop("format_version", None)
            if format_version not in (1, FORMAT_VERSION):
                raise CheckpointError(
                    f"{relative} has format {format_version}, which this keyflow does not read: it was written by "
                    "another keyflow version; run the pipeline with that version"
                )
            if format_version == FORMAT_VERSION:
                unseal(text)  # this format carries a checksum: its absence is damage
            data["operators"] = {uid: [StateFile(**f) for f in files] for uid, files in data["operators"].items()}
            manifest = Manifest(**data)
        except UnsealedError as damage:
            raise DamagedFileError(relative, damage.problem) from None
        except KeyflowError:
            raise  # another format: not damage (a rollback would not help)
        except (TypeError, KeyError, AttributeError, ValueError) as error:
            raise DamagedFileError(relative, f"is not a keyflow manifest ({type(error).__name__}: {error})") from None
        if relative != manifest_path(manifest.version):
            raise DamagedFileError(relative, f"holds version {manifest.version}: it was copied or renamed")
        return manifest


def manifest_path(version: int) -> str:
    return f"manifests/{version:010d}.json"


class Checkpoint:
    """One checkpoint directory."""

    def __init__(self, uri: str) -> None:
        self.fs, self.root = filesystem(uri)
        self.uri = absolute(uri)  # Spark's Python workers open it too, from another working directory

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    # -- small files -------------------------------------------------------------------------
    def exists(self, relative: str) -> bool:
        return exists(self.fs, self.path(relative))

    def read_text(self, relative: str) -> str:
        with self.fs.open_input_stream(self.path(relative)) as stream:
            return str(stream.read().decode())

    def write_atomically(self, relative: str, data: bytes) -> None:
        """Write to a temporary name, then move into place: readers see all or nothing."""
        target = self.path(relative)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        write_atomically(self.fs, target, data)

    # -- one job at a time ------------------------------------------------------------------
    def acquire(self) -> Any:
        """Lock the checkpoint for this process (local filesystems; released by ``release`` or
        when the process ends, even by SIGKILL). Raises CheckpointError if another job holds it."""
        if not isinstance(self.fs, fs.LocalFileSystem):
            return None  # object stores have no locks: run one job per checkpoint
        self.fs.create_dir(self.root, recursive=True)
        handle = lock_file(self.path(LOCK_FILE), wait=False)
        if handle is None:
            raise CheckpointError(
                f"checkpoint {self.uri} is in use by another running job; stop it first, or give this job "
                "another checkpoint directory"
            )
        return handle

    # -- events ------------------------------------------------------------------------------
    def append_event(self, event: dict[str, Any]) -> None:
        self.append_lines("events.jsonl", [json.dumps(event)])

    def append_lines(self, name: str, lines: list[str]) -> None:
        """Logs here change rarely (rescales, scheduler decisions): rewrite the file atomically,
        which works on object stores too."""
        text = self.read_text(name) if self.exists(name) else ""
        self.write_atomically(name, (text + "".join(line + "\n" for line in lines)).encode())

    def events(self) -> list[dict[str, Any]]:
        if not self.exists("events.jsonl"):
            return []
        return [json.loads(line) for line in self.read_text("events.jsonl").splitlines() if line.strip()]

    # -- manifests ---------------------------------------------------------------------------
    def versions(self) -> list[int]:
        selector = fs.FileSelector(self.path("manifests"), allow_not_found=True)
        names = [info.base_name for info in self.fs.get_file_info(selector)]
        return sorted(int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit())

    def manifest(self, version: int) -> Manifest:
        relative = manifest_path(version)
        try:
            text = self.read_text(relative)
        except FileNotFoundError:
            raise DamagedFileError(relative, "is missing") from None
        except UnicodeDecodeError:
            raise DamagedFileError(relative, "was altered: it is not text") from None
        return Manifest.from_json(text, relative)

    def latest(self) -> Manifest | None:
        versions = self.versions()
        return self.manifest(versions[-1]) if versions else None

    def commit(self, manifest: Manifest) -> None:
        self.write_atomically(manifest_path(manifest.version), manifest.to_json().encode())

    # -- state files -------------------------------------------------------------------------
    def version_dir(self, uid: str, version: int) -> str:
        return f"state/{operator_dir(uid)}/v-{version:010d}"

    def written_files(self, uid: str, version: int) -> list[StateFile]:
        """The state files subtasks wrote for ``version`` (read from their footers). Where two
        attempts of one subtask both finished (a retried task), the newer file is the one kept."""
        relative = self.version_dir(uid, version)
        selector = fs.FileSelector(self.path(relative), allow_not_found=True)
        newest: dict[tuple[str, str, str], tuple[fs.FileInfo, str]] = {}
        for info in sorted(self.fs.get_file_info(selector), key=lambda info: info.mtime_ns or 0):
            name = STATE_FILE_NAME.fullmatch(info.base_name)
            if name is None:
                continue  # also kept here: a pre-keyed operator's key reports and split index
            subtask = (name.group(1), name.group(2), name.group(3))
            replaced = newest.pop(subtask, None)
            if replaced is not None:
                self.fs.delete_file(replaced[0].path)
            newest[subtask] = (info, name.group(4))
        found = []
        for (kind, first, last), (info, digest) in newest.items():
            with self.fs.open_input_file(info.path) as handle:
                metadata = pq.read_metadata(handle)
            keys = int((metadata.metadata or {}).get(KEYS_METADATA, b"0"))
            found.append(
                StateFile(
                    f"{relative}/{info.base_name}", kind, version, int(first), int(last),
                    metadata.num_rows, keys, info.size or 0, digest,
                )
            )  # fmt: skip
        return sorted(found, key=lambda f: f.first)

    def version_dirs_after(self, version: int | None) -> list[str]:
        """The state directories (relative) of versions after ``version`` (None: all)."""
        found = []
        for uid_dir in self.fs.get_file_info(fs.FileSelector(self.path("state"), allow_not_found=True)):
            if uid_dir.type != fs.FileType.Directory:
                continue
            for version_dir in self.fs.get_file_info(fs.FileSelector(uid_dir.path, allow_not_found=True)):
                written = version_dir.base_name.removeprefix("v-")
                if written.isdigit() and (version is None or int(written) > version):
                    found.append(f"state/{uid_dir.base_name}/{version_dir.base_name}")
        return sorted(found)

    def discard_after(self, version: int | None) -> None:
        """Remove state written for versions after ``version`` that were never committed."""
        for directory in self.version_dirs_after(version):
            self.fs.delete_dir(self.path(directory))

    def source_batches(self, log: str) -> list[int]:
        """The micro-batches Spark's source log ``log`` (``offsets`` or ``commits``) holds."""
        selector = fs.FileSelector(self.path(f"{SOURCE_DIR}/{log}"), allow_not_found=True)
        return sorted(int(info.base_name) for info in self.fs.get_file_info(selector) if info.base_name.isdigit())


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


STATE_FILE_NAME = re.compile(r"(delta|full)-(\d+)-(\d+)\.([0-9a-f]{16})\.parquet")


def state_file_name(kind: str, first: int, last: int, digest: str) -> str:
    return f"{kind}-{first:05d}-{last:05d}.{digest}.parquet"


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as LZ4-compressed Parquet. Keys are unique in every file keyflow writes, so
    dictionary encoding and statistics go to the key-group column only: on other columns
    they cost 3-5x the time of the whole write and save nothing (measured in
    docs/benchmarks.md)."""
    sink = pa.BufferOutputStream()
    dictionary = [KEY_GROUP_COLUMN] if KEY_GROUP_COLUMN in table.column_names else False
    pq.write_table(table, sink, compression="lz4", row_group_size=256 * 1024, use_dictionary=dictionary,
                   write_statistics=dictionary)  # fmt: skip
    return bytes(sink.getvalue().to_pybytes())


def write_state_file(
    checkpoint: Checkpoint, uid: str, version: int, kind: str, first: int, last: int, table: pa.Table, keys: int
) -> None:
    """One subtask's state for one version, atomic, named by its checksum (the driver keeps the
    newest file of a subtask that a retried task wrote twice)."""
    data = parquet_bytes(table.replace_schema_metadata({KEYS_METADATA: str(keys).encode()}))
    name = state_file_name(kind, first, last, checksum(data))
    checkpoint.write_atomically(f"{checkpoint.version_dir(uid, version)}/{name}", data)


def write_key_report(checkpoint: Checkpoint, uid: str, version: int, first: int, last: int, keys: pa.Table) -> None:
    """A pre-keyed subtask's keys to check for version ``version`` (see ``keyflow.state.splits``)."""
    write_table(checkpoint, f"{checkpoint.version_dir(uid, version)}/{KEY_REPORT}-{first:05d}-{last:05d}.parquet", keys)


def read_key_reports(checkpoint: Checkpoint, uid: str, version: int) -> list[pa.Table]:
    """Every key report the subtasks of ``version`` wrote."""
    selector = fs.FileSelector(checkpoint.path(checkpoint.version_dir(uid, version)), allow_not_found=True)
    tables = []
    for info in checkpoint.fs.get_file_info(selector):
        if info.base_name.startswith(f"{KEY_REPORT}-"):
            tables.append(read_table(checkpoint, info.path[len(checkpoint.root) + 1 :]))
    return tables


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
        table = _read_range(checkpoint, f, first, last)
        key_groups = table.column(KEY_GROUP_COLUMN).to_numpy()
        current = base[key_groups]
        keep = (f.version > current) | ((f.version == current) & (f.kind == "full"))
        if not keep.all():
            table = table.filter(pa.array(keep))
        store.upsert(table)
    store.take_touched()


def _read_range(checkpoint: Checkpoint, f: StateFile, first: int, last: int) -> pa.Table:
    table = read_table(checkpoint, f.path, f.bytes, f.checksum)
    if first <= f.first and f.last <= last:
        return table
    key_groups = table.column(KEY_GROUP_COLUMN)
    return table.filter(pc.and_(pc.greater_equal(key_groups, first), pc.less_equal(key_groups, last)))
