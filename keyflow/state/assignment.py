"""State assignment: which state files each subtask restores, and when it compacts. Pure.

A version's state is a set of files, each covering a key-group range, written at whatever
parallelism ran then (Flink calls the mapping of such handles to new subtasks state
assignment). Per key group a restore reads the newest full file and the deltas after it;
a subtask whose range would need ``state.compaction.max-deltas`` or more deltas writes a
full file instead of a delta, which bounds restore cost at any later parallelism.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from keyflow.keygroups import key_group_range


@dataclass(frozen=True)
class StateFile:
    """One state file as the manifest lists it (``path`` relative to the checkpoint)."""

    path: str
    kind: str  # "delta" or "full"
    version: int
    first: int
    last: int
    rows: int
    keys_in_range: int
    bytes: int
    checksum: str | None = None  # of the file's bytes (None: a format-1 checkpoint recorded none)
    footer: str | None = None  # of its Parquet footer, which a partial read checks (None: read it whole)


def base_versions(files: Iterable[StateFile], max_parallelism: int) -> np.ndarray:
    """Per key group, the version of the newest full file covering it (-1: none)."""
    base = np.full(max_parallelism, -1, dtype=np.int64)
    for f in files:
        if f.kind == "full":
            np.maximum(base[f.first : f.last + 1], f.version, out=base[f.first : f.last + 1])
    return base


def needed_files(files: Iterable[StateFile], max_parallelism: int) -> list[StateFile]:
    """The files a restore of any key group still reads: each key group's newest full file
    and the deltas after it. Everything else is superseded."""
    files = list(files)
    base = base_versions(files, max_parallelism)
    keep = []
    for f in files:
        covered = base[f.first : f.last + 1]
        if (f.kind == "full" and (covered == f.version).any()) or (f.kind == "delta" and (covered < f.version).any()):
            keep.append(f)
    return sorted(keep, key=lambda f: (f.version, f.first))


def files_to_read(files: Iterable[StateFile], first: int, last: int, after_version: int = -1) -> list[StateFile]:
    """The files a restore of key groups ``first..last`` opens, in the order it applies them:
    oldest version first, a full file before a delta of its version; with ``after_version``
    only newer ones. Rows a newer full file supersedes are dropped while reading."""
    overlapping = [f for f in files if f.last >= first and f.first <= last and f.version > after_version]
    return sorted(overlapping, key=lambda f: (f.version, f.kind != "full"))


def delta_depth(files: Iterable[StateFile], max_parallelism: int) -> np.ndarray:
    """Per key group, how many delta files a restore reads after its newest full file."""
    files = list(files)
    base = base_versions(files, max_parallelism)
    depth = np.zeros(max_parallelism, dtype=np.int64)
    for f in files:
        if f.kind == "delta":
            depth[f.first : f.last + 1] += base[f.first : f.last + 1] < f.version
    return depth


def can_catch_up(files: list[StateFile], first: int, last: int, max_parallelism: int, held_version: int) -> bool:
    """Whether a store holding ``held_version`` of the range can be brought up to date with
    deltas alone (no full file of the range is newer than what it holds)."""
    return bool(base_versions(files, max_parallelism)[first : last + 1].max(initial=-1) <= held_version)


def compacting_subtasks(
    files: Iterable[StateFile], max_parallelism: int, parallelism: int, max_deltas: int
) -> frozenset[int]:
    """The subtasks that write a full file of their range this version: those whose range
    has a key group ``max_deltas`` or more deltas deep."""
    depth = delta_depth(files, max_parallelism)
    compact = set()
    for subtask in range(parallelism):
        first, last = key_group_range(max_parallelism, parallelism, subtask)
        if int(depth[first : last + 1].max(initial=0)) >= max_deltas:
            compact.add(subtask)
    return frozenset(compact)
