"""What a checkpoint holds, for people: versions, operators, parallelism history, state size."""

from __future__ import annotations

import json
from typing import Any

from keyflow.errors import CheckpointError, DamagedFileError
from keyflow.plan.event_time import iso_micros
from keyflow.scheduler.timeline import LOG_FILE
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.plan_file import PLAN_FILE, read_plan_file
from keyflow.state.watermarks import SourceWatermark


def describe_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """A JSON-ready summary of ``checkpoint`` (raises CheckpointError if it is not one,
    DamagedFileError if its plan.json is lost or damaged)."""
    saved = read_plan_file(checkpoint)
    if saved is None and checkpoint.manifests.versions():
        raise DamagedFileError(PLAN_FILE, "is missing")
    if saved is None:
        raise _not_a_checkpoint(checkpoint)
    plan = saved.graph
    operators = plan.keyed_operators()
    manifests, damaged = [], []
    for version in checkpoint.manifests.versions():
        try:
            manifests.append(checkpoint.manifests.read(version))
        except DamagedFileError as damage:
            if damage.problem != "is missing":  # else deleted by the running job's retention while we read
                damaged.append(str(damage))
    latest = manifests[-1] if manifests else None
    state = []
    for uid, operator in operators.items():
        files = latest.operators.get(uid, []) if latest else []
        newest = [f for f in files if latest and f.version == latest.version]
        state.append(
            {
                "uid": uid,
                "name": operator.name,
                "kind": operator.kind,
                "keys": list(operator.state.keys) if operator.state else None,
                "state_files": len(files),
                "state_bytes": sum(f.bytes for f in files),
                "keys_stored": sum(f.keys_in_range for f in newest),
                "full_files": sum(1 for f in files if f.kind == "full"),
            }
        )
    return {
        "checkpoint": checkpoint.uri,
        "pipeline": plan.name,
        "max_parallelism": plan.max_parallelism,
        "key_hash": plan.key_hash,
        "versions": [{"version": m.version, "parallelism": m.parallelism, "created": m.created} for m in manifests],
        "operators": state,
        "watermarks": _watermarks(latest.watermarks if latest else {}),
        "events": checkpoint.events(),
        "damaged": damaged,
    }


def _watermarks(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    """Each source's watermark after the newest version, and each split's newest event time."""
    found = []
    for uid, data in recorded.items():
        mark = SourceWatermark.from_dict(data)
        splits = {str(s): iso_micros(latest) for s, (latest, _) in sorted(mark.splits.items())}
        found.append({"source": uid, "watermark": iso_micros(mark.watermark), "split_event_times": splits})
    return found


def scheduler_log(checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """The adaptive scheduler's records (``scheduler.jsonl``), oldest first."""
    if not checkpoint.exists(PLAN_FILE):
        raise _not_a_checkpoint(checkpoint)
    if not checkpoint.exists(LOG_FILE):
        raise CheckpointError(
            f"{checkpoint.uri} has no {LOG_FILE}: no run on this checkpoint used the adaptive scheduler "
            "(run with --conf jobmanager.scheduler=adaptive)"
        )
    return [json.loads(line) for line in checkpoint.read_text(LOG_FILE).splitlines() if line.strip()]


def _not_a_checkpoint(checkpoint: Checkpoint) -> CheckpointError:
    return CheckpointError(f"{checkpoint.uri} is not a keyflow checkpoint (no {PLAN_FILE}); give the directory "
                           "passed to run(checkpoint=...) or --checkpoint")  # fmt: skip
