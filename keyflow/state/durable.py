"""Where a keyed subtask gets its state from and puts it back: memory (batch) or a checkpoint.

Both are pickled into Spark's Python workers. The checkpoint backend keeps each
worker's state in a process-wide cache between micro-batches (Spark reuses Python
workers), tagged with the version it holds; a task takes what the cache has for its
key-group range, catches it up from delta files or restores gaps from the checkpoint, and
so a steady micro-batch reads only the changes, never the whole state.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from keyflow.errors import DamagedFileError, EngineError, WorkerError
from keyflow.plan.descriptors import StateDescriptor
from keyflow.state.assignment import StateFile, can_catch_up
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.memory import KeyedStateStore
from keyflow.state.plan_file import PLAN_FILE
from keyflow.state.state_files import restore, write_key_report, write_state_file


class MemoryState:
    """Batch runs: state lives for one task."""

    def open(self, descriptors: dict[str, StateDescriptor], subtask: int, first: int, last: int) -> KeyedStateStore:
        return KeyedStateStore(descriptors)

    def close(self, store: KeyedStateStore, subtask: int, first: int, last: int) -> None:
        return None

    def release(self, store: KeyedStateStore, subtask: int, first: int, last: int) -> None:
        return None

    def must_write(self, subtask: int) -> bool:
        return False

    def report_keys(self, keys: pa.Table, first: int, last: int) -> None:
        return None  # batch runs read no pre-keyed sources


class Reports(Protocol):
    """Where subtasks report the files they wrote: a Spark accumulator (merged on the driver
    from the tasks that succeeded), or a list's ``extend`` in tests."""

    def add(self, term: list[Any]) -> object: ...


@dataclass(frozen=True)
class CheckpointedState:
    """One keyed operator in one micro-batch: restore from ``base_version``, write ``version``,
    report each file written to ``written``."""

    checkpoint_uri: str
    checkpoint_id: str
    run_id: str  # one per started job: cached state of another run is never trusted
    uid: str
    base_version: int  # -1: no state yet
    version: int
    files: tuple[StateFile, ...]
    compact: frozenset[int]  # subtasks that write a full file of their range this time
    max_parallelism: int
    written: Reports | None = field(default=None, compare=False)  # each StateFile written
    keys_reported: Reports | None = field(default=None, compare=False)  # each key report's path (pre-keyed)

    def open(self, descriptors: dict[str, StateDescriptor], subtask: int, first: int, last: int) -> KeyedStateStore:
        try:
            return self._restore(descriptors, first, last)
        except DamagedFileError as error:  # the driver names the newest intact version and the fix
            raise WorkerError(error) from None
        except OSError as error:
            raise WorkerError(Checkpoint(self.checkpoint_uri).storage_failed(error, f"restoring {self.uid}")) from None

    def _restore(self, descriptors: dict[str, StateDescriptor], first: int, last: int) -> KeyedStateStore:
        cached = _CACHE.take((self.checkpoint_id, self.uid), self.run_id, first, last)
        checkpoint = Checkpoint(self.checkpoint_uri)
        if not checkpoint.exists(PLAN_FILE):
            raise WorkerError(
                EngineError(
                    f"checkpoint {self.checkpoint_uri} is not visible from Spark's workers; on a cluster put "
                    "checkpoints on storage every executor reaches (a shared filesystem, HDFS, S3)"
                )
            )
        files = list(self.files)
        store = KeyedStateStore(descriptors)
        covered = np.zeros(last - first + 1, dtype=bool)
        for entry in cached:
            lo, hi = max(entry.first, first), min(entry.last, last)
            usable = entry.version <= self.base_version and can_catch_up(
                files, lo, hi, self.max_parallelism, entry.version
            )
            if not usable:
                continue
            if entry.version < self.base_version:
                restore(checkpoint, files, lo, hi, entry.store, self.max_parallelism, after_version=entry.version)
            if entry.first == first and entry.last == last:
                store = entry.store
            else:
                store.upsert(entry.store.to_table(entry.store.live_slots_in(lo, hi)))
            covered[lo - first : hi - first + 1] = True
        for lo, hi in _gaps(covered, first):
            restore(checkpoint, files, lo, hi, store, self.max_parallelism)
        store.take_touched()
        return store

    def close(self, store: KeyedStateStore, subtask: int, first: int, last: int) -> None:
        touched = store.take_touched()
        live = store.live_slots()
        if subtask in self.compact:
            table, kind = store.to_table(live), "full"
            store = KeyedStateStore(store.descriptors)  # compaction also drops cleared keys from memory
            store.upsert(table)
        else:
            table, kind = store.to_table(touched), "delta"
        checkpoint = Checkpoint(self.checkpoint_uri)
        try:
            file = write_state_file(checkpoint, self.uid, self.version, kind, first, last, table, len(live))
        except OSError as error:
            raise WorkerError(checkpoint.storage_failed(error, f"writing the state of {self.uid}")) from None
        if self.written is not None:
            self.written.add([file])
        _CACHE.put((self.checkpoint_id, self.uid), self.run_id, _Entry(first, last, self.version, store))

    def release(self, store: KeyedStateStore, subtask: int, first: int, last: int) -> None:
        """A store opened without rows (to fire timers) in which nothing changed: no file to
        write, as for a subtask Spark skipped; the worker keeps it for the next micro-batch."""
        _CACHE.put((self.checkpoint_id, self.uid), self.run_id, _Entry(first, last, self.base_version, store))

    def must_write(self, subtask: int) -> bool:
        """Whether the subtask writes a file even with no input: a compaction is due. Otherwise
        a subtask without rows writes nothing, as one Spark skipped: its state did not change."""
        return subtask in self.compact

    def report_keys(self, keys: pa.Table, first: int, last: int) -> None:
        """Keys of a pre-keyed operator to check (see ``keyflow.state.splits``), next to the
        subtask's state file of this version, so an uncommitted attempt's reports go with it."""
        path = write_key_report(Checkpoint(self.checkpoint_uri), self.uid, self.version, first, last, keys)
        if self.keys_reported is not None:
            self.keys_reported.add([path])


def _gaps(covered: np.ndarray, first: int) -> list[tuple[int, int]]:
    """Contiguous ranges of key groups not yet covered."""
    edges = np.diff(np.concatenate(([0], (~covered).astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(first + int(a), first + int(b)) for a, b in zip(starts, ends, strict=True)]


@dataclass
class _Entry:
    first: int
    last: int
    version: int
    store: KeyedStateStore


class _StateCache:
    """Per Python worker: the newest state this worker built for each key-group range.

    Entries belong to one run of a job: a new run (a restart, a retry after a failure)
    drops them, because an uncommitted attempt may have left a version number that a
    later committed version reuses. Entries of one operator never overlap (a newer entry
    evicts those it overlaps), so a worker holds at most one copy of any key group; at most
    ``operators`` operators are kept.
    """

    def __init__(self, operators: int = 8) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[str, list[_Entry]]] = OrderedDict()
        self._operators = operators

    def take(self, operator: tuple[str, str], run: str, first: int, last: int) -> list[_Entry]:
        """This run's entries overlapping ``first..last`` (removed: the caller owns them now)."""
        owner, entries = self._entries.get(operator, (run, []))
        if owner != run:
            entries = []
        taken = [e for e in entries if e.first <= last and e.last >= first]
        self._entries[operator] = (run, [e for e in entries if e not in taken])
        return taken

    def put(self, operator: tuple[str, str], run: str, entry: _Entry) -> None:
        owner, entries = self._entries.get(operator, (run, []))
        kept = [e for e in entries if owner == run and (e.last < entry.first or e.first > entry.last)]
        self._entries[operator] = (run, [*kept, entry])
        self._entries.move_to_end(operator)
        while len(self._entries) > self._operators:
            self._entries.popitem(last=False)


_CACHE = _StateCache()
