"""Checkpoints: keyed state in key-group-indexed files, versioned, with an atomic manifest.

Layout under the checkpoint directory (any ``pyarrow.fs`` filesystem)::

    plan.json                      the plan of the first run: K, key hash, operators
    manifests/0000000007.json      one per committed version; written last, atomically
    state/op-3/v-0000000007/delta-00000-13859.5c3a0f1e9b2d4e67.parquet
    events.jsonl                   rescales, restores and rollbacks
    rollback.json                  only while a rollback is applied (a start refuses until it is finished)
    scheduler.jsonl                the adaptive scheduler's slots and decisions (if it runs)
    source/                        Spark's own offsets for the streaming source

A :class:`Checkpoint` is the directory: small files, the lock, the event log. Its
``manifests`` (:class:`~keyflow.state.manifests.ManifestLog`) are the committed versions,
its ``state_files`` (:class:`~keyflow.state.state_files.StateFileStore`) the state the
subtasks write; each has a module of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from pyarrow import fs

from keyflow.errors import CheckpointError, ExternalSystemError
from keyflow.paths import OBJECT_STORES, absolute, exists, filesystem, lock_file, write_atomically
from keyflow.s3 import S3Settings
from keyflow.state.manifests import ManifestLog
from keyflow.state.state_files import StateFileStore

LOCK_FILE = ".keyflow.lock"
SOURCE_DIR = "source"  # Spark's offsets and commits for the streaming source
STAGING_DIR = "staged"  # output of sinks without a directory of their own (Kafka), until published
ROLLBACK_FILE = "rollback.json"  # present while a rollback is being applied


class Checkpoint:
    """One checkpoint directory."""

    def __init__(self, uri: str) -> None:
        self.fs, self.root = filesystem(uri)
        self.uri = absolute(uri)  # Spark's Python workers open it too, from another working directory
        self.manifests = ManifestLog(self)
        self.state_files = StateFileStore(self)

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
        if not self.on_object_store:  # an object store has no directories to make
            self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        write_atomically(self.fs, target, data)

    @property
    def on_object_store(self) -> bool:
        return isinstance(self.fs, OBJECT_STORES)

    @contextlib.contextmanager
    def storage(self, doing: str) -> Iterator[None]:
        """Turn a failure of the checkpoint's storage while ``doing`` into an error naming the
        store and the way on (the AWS SDK has retried it already, s3.attempts.maximum times)."""
        try:
            yield
        except OSError as error:
            raise self.storage_failed(error, doing) from None

    def storage_failed(self, error: OSError, doing: str) -> ExternalSystemError:
        if self.on_object_store:
            where = f"{self.uri}, {S3Settings.from_environment().described()}"
            check = ("the store is up and reachable (s3.endpoint, credentials, the bucket exists; transient errors "
                     "were retried s3.attempts.maximum times)")  # fmt: skip
        else:
            where, check = self.uri, "the directory is writable and its disk has room"
        return ExternalSystemError(
            f"the checkpoint's storage ({where}) failed while {doing}: {str(error).strip()}; check that {check}, then "
            "run the pipeline again: it resumes from the last committed micro-batch"
        )

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

    def source_batches(self, log: str) -> list[int]:
        """The micro-batches Spark's source log ``log`` (``offsets`` or ``commits``) holds."""
        selector = fs.FileSelector(self.path(f"{SOURCE_DIR}/{log}"), allow_not_found=True)
        return sorted(int(info.base_name) for info in self.fs.get_file_info(selector) if info.base_name.isdigit())
