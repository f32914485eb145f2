"""Checkpoints: keyed state in key-group-indexed files, versioned, with an atomic manifest.

Layout under the checkpoint directory (any ``pyarrow.fs`` filesystem)::

    plan.json                      the plan of the first run: K, key hash, operators
    manifests/0000000007.json      one per committed version; written last, atomically
    state/op-3/v-0000000007/delta-00000-13859.parquet
    events.jsonl                   rescales and restores
    scheduler.jsonl                the adaptive scheduler's slots and decisions (if it runs)
    source/                        Spark's own offsets for the streaming source

A state file holds the keys one subtask changed in one version (``delta``) or all keys
of its key-group range (``full``, written by compaction), sorted by nothing in
particular: rows carry their key group, and files are listed in the manifest with their
key-group range, so any range can be restored from files written at any parallelism.
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

from keyflow.errors import KeyflowError
from keyflow.keygroups import KEY_GROUP_COLUMN
from keyflow.paths import absolute, exists, filesystem, lock_file, write_atomically
from keyflow.state.assignment import StateFile, base_versions, files_to_read
from keyflow.state.memory import KeyedStateStore

FORMAT_VERSION = 1
LOCK_FILE = ".keyflow.lock"
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
    # A pre-keyed source: {"splits": [key group of each split], "index": {uid: [[index file, rows]]}}
    pre_keyed: dict[str, Any] = field(default_factory=dict)

    def files(self) -> list[str]:
        """Every file of the checkpoint this version needs: state files and split indexes."""
        state = [f.path for files in self.operators.values() for f in files]
        return state + [path for files in self.pre_keyed.get("index", {}).values() for path, _ in files]

    def to_json(self) -> str:
        return json.dumps({"format_version": FORMAT_VERSION, **asdict(self)}, indent=1)

    @staticmethod
    def from_json(text: str, where: str) -> Manifest:
        data = json.loads(text)
        if data.pop("format_version", None) != FORMAT_VERSION:
            raise CheckpointError(f"{where} has an unknown format; it was written by another keyflow version")
        data["operators"] = {uid: [StateFile(**f) for f in files] for uid, files in data["operators"].items()}
        return Manifest(**data)


class CheckpointError(KeyflowError):
    """A checkpoint that cannot be used as it is (the runtime adds the fix)."""


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
        relative = f"manifests/{version:010d}.json"
        return Manifest.from_json(self.read_text(relative), self.path(relative))

    def latest(self) -> Manifest | None:
        versions = self.versions()
        return self.manifest(versions[-1]) if versions else None

    def commit(self, manifest: Manifest) -> None:
        self.write_atomically(f"manifests/{manifest.version:010d}.json", manifest.to_json().encode())

    # -- state files -------------------------------------------------------------------------
    def version_dir(self, uid: str, version: int) -> str:
        return f"state/{operator_dir(uid)}/v-{version:010d}"

    def written_files(self, uid: str, version: int) -> list[StateFile]:
        """The state files subtasks wrote for ``version`` (read from their footers)."""
        relative = self.version_dir(uid, version)
        selector = fs.FileSelector(self.path(relative), allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            if not info.base_name.endswith(".parquet") or not info.base_name.startswith(("delta-", "full-")):
                continue  # also kept here: a pre-keyed operator's key reports and split index
            kind, first, last = info.base_name[: -len(".parquet")].split("-")
            with self.fs.open_input_file(info.path) as handle:
                metadata = pq.read_metadata(handle)
            keys = int((metadata.metadata or {}).get(KEYS_METADATA, b"0"))
            found.append(
                StateFile(
                    f"{relative}/{info.base_name}", kind, version, int(first), int(last),
                    metadata.num_rows, keys, info.size or 0,
                )
            )  # fmt: skip
        return sorted(found, key=lambda f: f.first)

    def discard_after(self, version: int | None) -> None:
        """Remove state written for versions after ``version`` that were never committed."""
        for uid_dir in self.fs.get_file_info(fs.FileSelector(self.path("state"), allow_not_found=True)):
            for version_dir in self.fs.get_file_info(fs.FileSelector(uid_dir.path, allow_not_found=True)):
                written = int(version_dir.base_name.removeprefix("v-"))
                if version is None or written > version:
                    self.fs.delete_dir(version_dir.path)

    def retain(self, count: int) -> list[int]:
        """Keep the newest ``count`` versions; delete older manifests and files none of them uses."""
        versions = self.versions()
        dropped, kept = versions[:-count], versions[-count:]
        if not dropped:
            return []
        used = {path for version in kept for path in self.manifest(version).files()}
        for version in dropped:
            self.fs.delete_file(self.path(f"manifests/{version:010d}.json"))
        oldest_kept = kept[0]
        selector = fs.FileSelector(self.path("state"), recursive=True, allow_not_found=True)
        remaining: dict[str, int] = {}  # version directory -> files it keeps
        for info in self.fs.get_file_info(selector):
            if info.type != fs.FileType.File:
                continue
            directory, relative = info.path.rsplit("/", 1)[0], info.path[len(self.root) + 1 :]
            if relative not in used and _version_of(relative) < oldest_kept:
                self.fs.delete_file(info.path)
                remaining.setdefault(directory, 0)
            else:
                remaining[directory] = remaining.get(directory, 0) + 1
        for directory, files in remaining.items():
            if not files:
                self.fs.delete_dir(directory)
        return dropped


def operator_dir(uid: str) -> str:
    """The directory of an operator's state: ``op-<uid>``, where a uid with characters that
    are not safe in paths on every filesystem (HDFS refuses ':'; macOS and Windows ignore
    case) has them replaced and a hash of the uid added, so distinct uids never share one."""
    safe = re.sub(r"[^a-z0-9_.-]", "_", uid.lower())
    return f"op-{safe}" if safe == uid else f"op-{safe}-{hashlib.sha1(uid.encode()).hexdigest()[:8]}"


def _version_of(relative: str) -> int:
    part = next(p for p in relative.split("/") if p.startswith("v-"))
    return int(part.removeprefix("v-"))


def state_file_name(kind: str, first: int, last: int) -> str:
    return f"{kind}-{first:05d}-{last:05d}.parquet"


def write_state_file(
    checkpoint: Checkpoint, uid: str, version: int, kind: str, first: int, last: int, table: pa.Table, keys: int
) -> None:
    """One subtask's state for one version; atomic, and a retried task overwrites its own file."""
    table = table.replace_schema_metadata({KEYS_METADATA: str(keys).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="lz4", row_group_size=256 * 1024)
    name = state_file_name(kind, first, last)
    checkpoint.write_atomically(f"{checkpoint.version_dir(uid, version)}/{name}", sink.getvalue().to_pybytes())


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


def write_table(checkpoint: Checkpoint, relative: str, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="lz4")
    checkpoint.write_atomically(relative, sink.getvalue().to_pybytes())


def read_table(checkpoint: Checkpoint, relative: str) -> pa.Table:
    with checkpoint.fs.open_input_file(checkpoint.path(relative)) as handle:
        return pq.read_table(handle)


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
    with checkpoint.fs.open_input_file(checkpoint.path(f.path)) as handle:
        table = pq.read_table(handle)
    if first <= f.first and f.last <= last:
        return table
    key_groups = table.column(KEY_GROUP_COLUMN)
    return table.filter(pc.and_(pc.greater_equal(key_groups, first), pc.less_equal(key_groups, last)))
