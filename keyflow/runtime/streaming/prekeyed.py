"""The driver's side of a pre-keyed source (``reinterpret_as_keyed`` right after a log).

It owns the split → key-group mapping (fixed by the first run, persisted in every manifest,
extended when splits are added), writes the layout the source's reader follows (which
splits each subtask reads, at the parallelism of the next micro-batch), and checks, before a
micro-batch commits, that no key is in two splits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

import pyarrow as pa

from keyflow.config import PRE_KEYED_VERIFY
from keyflow.connectors.splits import read_layout, write_layout
from keyflow.errors import CheckpointError, DataError, KeyflowError, PlanError
from keyflow.keygroups import split_key_groups
from keyflow.plan.compile import CompiledPlan, pre_keyed_problem
from keyflow.plan.nodes import KeyedNode, SourceNode
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.manifests import Manifest
from keyflow.state.splits import SplitIndex
from keyflow.state.state_files import read_table, write_table

LAYOUT_FILE = "source-layout.json"

log = logging.getLogger("keyflow")


@dataclass(frozen=True)
class IndexFile:
    """One file of a split index as the manifest lists it (size and checksum: None in
    checkpoints written before they were recorded)."""

    path: str
    rows: int
    bytes: int | None = None
    checksum: str | None = None


@dataclass
class PreKeyedSource:
    source: SourceNode
    keys: tuple[str, ...]
    checkpoint: Checkpoint
    operators: dict[str, KeyedNode]  # the keyed operators reading it, by uid
    mapping: list[int] = field(default_factory=list)
    index_files: dict[str, list[IndexFile]] = field(default_factory=dict)  # oldest first
    indexes: dict[str, SplitIndex] = field(default_factory=dict)
    complete: bool = True  # False once a micro-batch ran with verify=off: its new keys are not indexed

    @staticmethod
    def of(
        plan: CompiledPlan, sources: Sequence[SourceNode], checkpoint: Checkpoint, manifest: Manifest | None
    ) -> PreKeyedSource | None:
        """The pre-keyed source of ``plan`` as the newest manifest left it (None: not pre-keyed)."""
        pre_keyed = [source for source in sources if plan.pre_keyed_by(source.id)]
        if not pre_keyed:
            return None
        source = pre_keyed[0]  # the only source: refused with several (restore.streaming_sources)
        keys = plan.pre_keyed_by(source.id)
        saved = manifest.pre_keyed if manifest else {}
        operators = {uid: node for uid, node in plan.keyed_nodes().items() if plan.reads_pre_keyed(node)}
        files = {uid: [IndexFile(*entry) for entry in saved.get("index", {}).get(uid, [])] for uid in operators}
        indexes = {}
        for uid, node in operators.items():
            tables = [read_table(checkpoint, f.path, f.bytes, f.checksum) for f in files[uid]]
            indexes[uid] = SplitIndex(node.keys, pa.concat_tables(tables) if tables else None)
        mapping, complete = list(saved.get("splits", [])), saved.get("complete", True)
        if not complete and plan.config.get(PRE_KEYED_VERIFY) != "off":
            log.warning(
                "source %r: earlier micro-batches ran with pipeline.pre-keyed.verify=off, so the keys they saw first "
                "are not in the split index; a key in two splits is still caught when one subtask reads both, not "
                "across subtasks. Start a new checkpoint to check every key",
                source.name,
            )
        return PreKeyedSource(source, keys, checkpoint, operators, mapping, files, indexes, complete)

    @property
    def source_id(self) -> int:
        return self.source.id

    @property
    def layout(self) -> str:
        return f"{self.checkpoint.uri.rstrip('/')}/{LAYOUT_FILE}"

    def prepare(self, plan: CompiledPlan) -> None:
        """Before the next micro-batch is planned: map splits added since, and lay the splits out
        for its parallelism."""
        splits = self.source.source.current_splits()
        try:
            self.mapping = split_key_groups(self.mapping, splits, plan.max_parallelism)
        except KeyflowError as error:
            raise PlanError(pre_keyed_problem(self.source.name, self.keys, error)) from None
        write_layout(self.layout, self.mapping, plan.max_parallelism, plan.operator(self.source.id).parallelism)

    def verify(self, batch: int, mode: str, reported: dict[str, list[str]]) -> tuple[dict[str, Any], int]:
        """Check the keys the subtasks of ``batch`` reported (``reported``: each operator's key
        report files, by uid; ``mode`` fail: raise before anything commits; warn: log and go on);
        returns the manifest's ``pre_keyed`` section and how many keys were found in two splits
        (by any of its operators)."""
        total = 0
        self.complete = self.complete and mode != "off"
        mapped = read_layout(self.layout)["key_groups"]  # the reader maps splits added while running
        if mapped[: len(self.mapping)] != self.mapping:
            raise CheckpointError(
                f"{self.layout} maps splits {mapped}, not as the checkpoint {self.mapping}; was it edited?"
            )
        self.mapping = list(mapped)
        for uid, node in self.operators.items():
            reports = [read_table(self.checkpoint, path) for path in dict.fromkeys(reported.get(uid, []))]
            if not reports:
                continue
            index = self.indexes[uid]
            count, examples, new = index.check(pa.concat_tables(reports, promote_options="permissive"), self.mapping)
            if count and mode == "fail":
                raise DataError(
                    self._message(node, batch, count, examples, "Nothing of it was committed. ")
                    + "; pipeline.pre-keyed.verify=warn goes on, counting such keys"
                )
            if count:
                log.warning("%s", self._message(node, batch, count, examples, "It goes on (warn). "))
                total = max(total, count)  # operators on one source see the same keys
            if new.num_rows:
                index.add(new)
                self._persist(uid, batch)
        index = {uid: [list(astuple(entry)) for entry in files] for uid, files in self.index_files.items()}
        return {"splits": list(self.mapping), "index": index, "complete": self.complete}, total

    def _persist(self, uid: str, batch: int) -> None:
        """Write the keys just added to the index as one file, merged with the newest files of
        similar size (a binary counter: O(log n) files, each key rewritten O(log n) times)."""
        table = self.indexes[uid].table
        assert table is not None
        files = self.index_files[uid]
        rows = table.num_rows - sum(f.rows for f in files)
        while files and files[-1].rows <= 2 * rows:
            rows += files.pop().rows
        start = table.num_rows - rows
        path = f"{self.checkpoint.state_files.version_dir(uid, batch)}/split-index-{start:012d}.parquet"
        files.append(IndexFile(path, rows, *write_table(self.checkpoint, path, table.slice(start, rows))))

    def _message(self, node: KeyedNode, batch: int, count: int, examples: list[Any], outcome: str) -> str:
        shown = "; ".join(example.describe() for example in examples[:3])
        more = f" ({count} keys in all)" if count > len(examples[:3]) else ""
        return (
            f"operator {node.name!r}: source {self.source.name!r} is read as pre-keyed by {list(self.keys)}, but "
            f"{shown}{more} (micro-batch {batch}): a key must be in exactly one split, or its state splits in two. "
            f"{outcome}Write each key to one split (keyflow log append --key), or use "
            f"key_by({', '.join(map(repr, self.keys))}) instead of reinterpret_as_keyed"
        )
