"""``plan.json``: what the first run of a checkpoint fixed for every later run.

The job graph (K, key hash, operators and their state by uid), the checkpoint's id, and
facts learnt while running that must not change: the source's schema and the keyed
operators' key types (they decide the hash). Restores read it back, never re-derive it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from keyflow.errors import DamagedFileError, KeyflowError
from keyflow.plan.graph import JobGraph
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.seal import UnsealedError, seal, unseal

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class PlanFile:
    checkpoint_id: str
    graph: JobGraph
    source_schema: str | None = None
    key_types: dict[str, dict[str, str]] = field(default_factory=dict)  # uid -> key column -> Spark type

    def with_facts(self, **facts: Any) -> PlanFile:
        return dataclasses.replace(self, **facts)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"checkpoint_id": self.checkpoint_id, "plan": self.graph.to_dict()}
        if self.source_schema is not None:
            data["source_schema"] = self.source_schema
        if self.key_types:
            data["key_types"] = self.key_types
        return data

    def to_json(self) -> str:
        return seal(self.to_dict())

    @staticmethod
    def from_json(text: str) -> PlanFile:
        """Raises DamagedFileError if ``text`` is torn, altered or not a plan file (one written
        before plan files were sealed is read unchecked)."""
        try:
            return PlanFile.from_dict(unseal(text, sealed=False))
        except UnsealedError as damage:
            raise DamagedFileError(PLAN_FILE, damage.problem) from None

    @staticmethod
    def from_dict(data: dict[str, Any]) -> PlanFile:
        try:
            return PlanFile(
                checkpoint_id=str(data["checkpoint_id"]),
                graph=JobGraph.from_dict(data["plan"]),
                source_schema=data.get("source_schema"),
                key_types=dict(data.get("key_types", {})),
            )
        except KeyflowError:
            raise  # a plan of another format version says so itself
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DamagedFileError(
                PLAN_FILE, f"is not a keyflow plan ({type(error).__name__}: {error}): damaged, or not keyflow's"
            ) from None


def read_plan_file(checkpoint: Checkpoint) -> PlanFile | None:
    """The checkpoint's plan file, or None for a checkpoint no run has started yet."""
    if not checkpoint.exists(PLAN_FILE):
        return None
    try:
        text = checkpoint.read_text(PLAN_FILE)
    except UnicodeDecodeError:
        raise DamagedFileError(PLAN_FILE, "was altered: it is not text") from None
    return PlanFile.from_json(text)


def write_plan_file(checkpoint: Checkpoint, plan_file: PlanFile) -> None:
    checkpoint.write_atomically(PLAN_FILE, plan_file.to_json().encode())
