"""Pre-keyed reading of a source of splits (the log, Kafka's partitions): split ``s`` holds key
group ``layout[s]``, so subtask ``i`` reads the splits of its key groups and no shuffle is needed.

The layout is a file the job writes when it starts or rescales; a reader maps splits added
while running by the same rule the job uses on a restart, and persists that mapping.
"""

from __future__ import annotations

import json
from typing import Any

from keyflow.errors import KeyflowError
from keyflow.keygroups import split_key_groups, subtask_for_key_group
from keyflow.paths import filesystem, write_atomically

Range = tuple[int, int, int, int]
"""``(split, first offset, end offset, key group)``; key group -1 where the source is not pre-keyed."""


def write_layout(path: str, key_groups: list[int], max_parallelism: int, parallelism: int) -> None:
    """Tell a pre-keyed reader how to lay out the next micro-batch it plans."""
    layout = {"key_groups": key_groups, "max_parallelism": max_parallelism, "parallelism": parallelism}
    files, target = filesystem(path)
    write_atomically(files, target, json.dumps(layout).encode())


def read_layout(path: str) -> dict[str, Any]:
    files, target = filesystem(path)
    with files.open_input_stream(target) as stream:
        layout: dict[str, Any] = json.loads(stream.read())
    return layout


def map_new_splits(path: str, splits: int, where: str) -> list[int]:
    """The key group of every split, splits added since the last micro-batch included: the job
    persists the layout's mapping with the next commit (the same mapping it derives itself on a
    restart: added splits are mapped in order, each by the same rule)."""
    layout = read_layout(path)
    key_groups: list[int] = layout["key_groups"]
    if splits > len(key_groups):
        try:
            key_groups = split_key_groups(key_groups, splits, layout["max_parallelism"])
        except KeyflowError as error:
            raise ValueError(f"pre-keyed {where}: {error}") from None
        write_layout(path, key_groups, layout["max_parallelism"], layout["parallelism"])
    return key_groups


def pre_keyed_ranges(path: str, ranges: list[tuple[int, int, int]], where: str) -> list[list[Range]]:
    """``(split, first, end)`` ranges with data, per subtask of the layout, each with its key group."""
    layout = read_layout(path)
    key_groups, parallelism, max_parallelism = layout["key_groups"], layout["parallelism"], layout["max_parallelism"]
    assigned: list[list[Range]] = [[] for _ in range(parallelism)]
    for split, first, last in ranges:
        if split >= len(key_groups):
            raise ValueError(
                f"{where}: split {split} has no key group in {path}; it was added after the micro-batch was "
                "planned. Restart the pipeline; it maps new splits on start"
            )
        key_group = key_groups[split]
        assigned[subtask_for_key_group(max_parallelism, parallelism, key_group)].append((split, first, last, key_group))
    return assigned


def limited_ends(start: dict[str, int], ends: dict[str, int], max_rows: int) -> dict[str, int]:
    """The ends of a micro-batch of at most ``max_rows`` records: the limit shared over the
    splits with data, smallest backlog first; what a split does not need goes to the next."""
    budget, taken = max_rows, {}
    pending = sorted((ends[s] - start.get(s, 0), s) for s in ends if ends[s] > start.get(s, 0))
    for position, (backlog, split) in enumerate(pending):
        taken[split] = min(backlog, budget // (len(pending) - position))
        budget -= taken[split]
    return {split: start.get(split, 0) + taken.get(split, 0) for split in ends}


def spread_ranges(ranges: list[tuple[int, int, int]], partitions: int) -> list[list[Range]]:
    """``(split, first, end)`` ranges spread over ``partitions`` Spark partitions (split ``s`` →
    partition ``s % partitions``), so a source's parallelism does not depend on its splits."""
    assigned: list[list[Range]] = [[] for _ in range(partitions)]
    for split, first, last in ranges:
        assigned[split % partitions].append((split, first, last, -1))
    return assigned
