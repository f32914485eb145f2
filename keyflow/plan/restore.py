"""Can a checkpoint's plan be restored by this pipeline? Pure comparison of two job graphs.

The first run persists its plan next to its state; a restore reads it back and never
re-derives what state depends on: the number of key groups, the key hash, and which
keyed operator (by uid, see ``keyflow.plan.uids``) owns which state.
"""

from __future__ import annotations

from keyflow.errors import RestoreError
from keyflow.plan.graph import JobGraph, Operator


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
        changes = [] if saved_as is None else _changes(saved_as, operator)
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


# State layouts and key-group sources, in the words of restore errors.
WORDS = {"partials": "merged partials", "running": "running partials", "retracting": "retractable values",
          "windows": "per-window partials", "sessions": "open sessions", "top_rows": "each key's first rows",
          "all_rows": "each key's current rows", "over_rows": "rows waiting for the watermark",
          "hash": "the key hash", "splits": "a pre-keyed source's splits"}  # fmt: skip


def _changes(saved: Operator, current: Operator) -> list[str]:
    """What differs between the state two operators keep, in the user's words."""
    assert saved.state is not None  # both keyed
    assert current.state is not None
    old, new = saved.state, current.state
    changes = []
    if saved.kind != current.kind:
        changes.append(f"it is now a {current.kind} operator, the checkpoint's a {saved.kind} one")
    if old.keys != new.keys:
        changes.append(f"it is now keyed by {list(new.keys)}, the checkpoint's state by {list(old.keys)}")
    if dict(old.contents) != dict(new.contents):  # state is stored by name: order does not matter
        changes.append(f"it now keeps {dict(new.contents)}, the checkpoint {dict(old.contents)}")
    if old.layout != new.layout:
        changes.append(f"it now keeps its state as {WORDS[new.layout]}, the checkpoint as {WORDS[old.layout]}")
    if old.key_groups != new.key_groups:
        changes.append(
            f"it now takes its key groups from {WORDS[new.key_groups]}, the checkpoint from {WORDS[old.key_groups]}"
        )
    if old.version != new.version:
        changes.append(f"its state layout is now version {new.version}, the checkpoint's {old.version}")
    return changes
