"""``plan.json``: what the first run of a checkpoint fixed for every later run.

The job graph (K, key hash, operators and their state by uid), the checkpoint's id, and
facts learnt while running that must not change: the source's schema and the keyed
operators' key types (they decide the hash). Restores read it back, never re-derive it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from keyflow.errors import KeyflowError
from keyflow.plan.graph import JobGraph
from keyflow.state.checkpoint import Checkpoint, CheckpointError

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class PlanFile:
    checkpoint_id: str
    graph: JobGraph
    source_schema: str | None = None
    key_types: dict[str, dict[str, str]] = field(default_factory=dict)  # uid -> key column -> Spark type

    def with_facts(self, **facts: Any) -> PlanFile:
        return dataclasses.replace(self, **facts)

    def to_json(self) -> str:
        data: dict[str, Any] = {"checkpoint_id": self.checkpoint_id, "plan": self.graph.to_dict()}
        if self.source_schema is not None:
            data["source_schema"] = self.source_schema
        if self.key_types:
            data["key_types"] = self.key_types
        return json.dumps(data, indent=1)

    @staticmethod
    def from_json(text: str, where: str) -> PlanFile:
        try:
            data = json.loads(text)
            return PlanFile(
                checkpoint_id=str(data["checkpoint_id"]),
                graph=JobGraph.from_dict(data["plan"]),
                source_schema=data.get("source_schema"),
                key_types=dict(data.get("key_types", {})),
            )
        except KeyflowError:
            raise  # a plan of another format version says so itself
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(
                f"{where} is not a readable keyflow plan ({type(error).__name__}: {error}); it was damaged or "
                "written by something else. Restore it from a copy, or start with a new checkpoint directory"
            ) from None


def read_plan_file(checkpoint: Checkpoint) -> PlanFile | None:
    """The checkpoint's plan file, or None for a checkpoint no run has started yet."""
    if not checkpoint.exists(PLAN_FILE):
        return None
    return PlanFile.from_json(checkpoint.read_text(PLAN_FILE), checkpoint.path(PLAN_FILE))


def write_plan_file(checkpoint: Checkpoint, plan_file: PlanFile) -> None:
    checkpoint.write_atomically(PLAN_FILE, plan_file.to_json().encode())
