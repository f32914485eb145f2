"""Can a checkpoint's plan be restored by this pipeline? Pure comparison of two job graphs.

The first run persists its plan next to its state; a restore reads it back and never
re-derives what state depends on: the number of key groups, the key hash, and which
keyed operator (by uid, see ``keyflow.plan.uids``) owns which state.
"""

from __future__ import annotations

from typing import Any

from keyflow.errors import RestoreError
from keyflow.plan.graph import JobGraph, Operator


def state_signature(operator: Operator) -> dict[str, Any]:
    """What an operator's state depends on: kind, keys, its declared state or aggregates, and
    where its key groups come from (the key hash, or a pre-keyed source's splits)."""
    details = operator.details
    return {
        "kind": operator.kind,
        "keys": details.get("keys"),
        "state": details.get("state", details.get("aggregations")),
        "layout": details.get("state_layout", "partials"),
        "key_groups": details.get("key_groups", "hash"),
    }


def check_restorable(
    saved: JobGraph,
    current: JobGraph,
    configured_max_parallelism: int | None,
    ignore_unclaimed_state: bool,
    checkpoint: str,
) -> list[str]:
    """Raise a RestoreError with the fix if ``current`` cannot take over ``saved``'s state;
    return the uids of saved operators whose state is dropped (only when allowed)."""
    before, now = saved.keyed_operators(), current.keyed_operators()
    if saved.name != current.name:
        raise RestoreError(
            f"checkpoint {checkpoint} belongs to pipeline {saved.name!r}, not {current.name!r}; "
            "use another checkpoint directory for this pipeline"
        )
    if configured_max_parallelism is not None and configured_max_parallelism != saved.max_parallelism:
        raise RestoreError(
            f"pipeline.max-parallelism={configured_max_parallelism} but checkpoint {checkpoint} holds state in "
            f"{saved.max_parallelism} key groups, which cannot change; remove the setting or set it to "
            f"{saved.max_parallelism}"
        )
    if saved.key_hash != current.key_hash:
        raise RestoreError(
            f"checkpoint {checkpoint} was written with key hash {saved.key_hash!r}, this pipeline uses "
            f"{current.key_hash!r}; keys would land in other key groups; restore with the same hash"
        )
    for uid, operator in now.items():
        saved_as = before.get(uid) or _same_name({u: op for u, op in before.items() if u not in now}, operator)
        changes = [] if saved_as is None else _changes(state_signature(saved_as), state_signature(operator))
        if changes:
            raise RestoreError(
                f"operator {operator.name!r} (uid {uid!r}) cannot restore its state from checkpoint {checkpoint}: "
                f"{'; '.join(changes)}. Change it back, or start with a new checkpoint directory (the state is lost)"
            )
        if uid not in before:
            raise RestoreError(
                f"operator {operator.name!r} (uid {uid!r}) has no state in checkpoint {checkpoint}, which holds "
                f"{_described(before)}; is this the checkpoint of another pipeline? Start with a new checkpoint "
                "directory, or, if the operator was renamed, give it its old uid with .uid(...)"
            )
    unclaimed = sorted(set(before) - set(now))
    if unclaimed and not ignore_unclaimed_state:
        raise RestoreError(
            f"checkpoint {checkpoint} holds state of {_described({u: before[u] for u in unclaimed})} which this "
            "pipeline does not have; to drop that state set execution.state-recovery.ignore-unclaimed-state=true"
        )
    return unclaimed


def _described(operators: dict[str, Operator]) -> str:
    return ", ".join(f"{op.name!r} (uid {uid!r}, {op.kind})" for uid, op in operators.items()) or "no keyed state"


def _same_name(saved: dict[str, Operator], operator: Operator) -> Operator | None:
    """The saved keyed operator (of those no current one claims) of the same name and kind,
    when there is one: its derived uid changed because its keys did."""
    found = [op for op in saved.values() if op.name == operator.name and op.kind == operator.kind]
    return found[0] if len(found) == 1 else None


_WHAT = {
    "kind": "it is now a {new} operator, the checkpoint's a {old} one",
    "keys": "it is now keyed by {new}, the checkpoint's state by {old}",
    "state": "it now keeps {new}, the checkpoint {old}",
    "layout": "it now keeps its state as {new}, the checkpoint as {old}",
    "key_groups": "it now takes its key groups from {new}, the checkpoint from {old}",
}
_WORDS = {"partials": "merged partials", "running": "running partials", "retracting": "retractable values",
          "hash": "the key hash", "splits": "a pre-keyed source's splits"}  # fmt: skip


def _changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two state signatures, in the user's words."""
    return [
        _WHAT[field].format(old=_WORDS.get(str(saved[field]), saved[field]), new=_WORDS.get(str(value), value))
        for field, value in current.items()
        if saved[field] != value
    ]
