"""Operator ids that survive pipeline changes: Flink's ``uid``, explicit or derived.

State is matched to operators by uid on restore. A uid the user sets (``.uid("...")``) is
kept as given. Any other operator's uid is its name (``name#2``, ``name#3``... for repeats in
creation order), which depends on nothing else in the pipeline: inserting or removing a
stateless operator elsewhere does not change it; renaming the operator does (give it
``.uid(old name)`` to keep its state).
"""

from __future__ import annotations

from collections.abc import Sequence

from keyflow.errors import PlanError
from keyflow.plan.nodes import Node


def assign_uids(ordered: Sequence[Node]) -> dict[int, str]:
    """Each node's uid by node id; a PlanError if two operators set the same uid."""
    uids: dict[int, str] = {}
    owner: dict[str, Node] = {}
    for node in ordered:
        if node.uid is None:
            continue
        if node.uid in owner:
            raise PlanError(
                f"operators {owner[node.uid].name!r} and {node.name!r} both have uid {node.uid!r}; "
                "a uid names one operator's state, give each operator its own"
            )
        owner[node.uid] = node
        uids[node.id] = node.uid
    for node in sorted(ordered, key=lambda node: node.id):
        if node.uid is not None:
            continue
        base = candidate = node.name
        repeat = 1
        while candidate in owner:
            repeat += 1
            candidate = f"{base}#{repeat}"
        owner[candidate] = node
        uids[node.id] = candidate
    return uids


def check_uid(uid: object) -> str:
    """A uid as given by the user: a non-empty string."""
    if not isinstance(uid, str) or not uid.strip():
        raise PlanError(f"uid {uid!r} is invalid; give a non-empty string such as uid('per-user-totals')")
    return uid
