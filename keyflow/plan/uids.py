"""Operator ids that survive pipeline changes: Flink's ``uid``, explicit or derived.

Keyed state is stored under its operator's uid and restored by it. A uid the user sets
(``.uid("...")``) is kept as given. A keyed operator without one is ``name[keys]``
(``running_total[user]``): it depends on nothing else in the pipeline, so inserting or
removing other operators does not change it; renaming the operator or changing its keys
does (give it ``.uid(old uid)`` to keep its state). Other operators' derived uids are
their names; they are assigned last, so they never displace a keyed operator's uid.

Two keyed operators with the same name and keys cannot be told apart by their derived
uids (reordering them would swap their state): they get ``#2``, ``#3``… here, and a
streaming run refuses them until each has an explicit uid (:func:`ambiguous_keyed`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keyflow.errors import PlanError
from keyflow.plan.nodes import KeyedNode, Node, SinkNode


def derived_uid(node: Node) -> str:
    if isinstance(node, KeyedNode):
        return f"{node.name}[{','.join(node.keys)}]"
    return node.name


def assign_uids(ordered: Sequence[Node]) -> dict[int, str]:
    """Each node's uid by node id; a PlanError if two operators set the same uid."""
    uids: dict[int, str] = {}
    owner: dict[str, Node] = {}
    for node in ordered:
        if node.explicit_uid is None:
            continue
        if node.explicit_uid in owner:
            raise PlanError(
                f"operators {owner[node.explicit_uid].name!r} and {node.name!r} both have uid "
                f"{node.explicit_uid!r}; a uid names one operator's state, give each operator its own"
            )
        owner[node.explicit_uid] = node
        uids[node.id] = node.explicit_uid
    by_id = sorted(ordered, key=lambda node: node.id)
    keyed = [node for node in by_id if node.keyed]
    sinks = [node for node in by_id if isinstance(node, SinkNode)]
    others = [node for node in by_id if not node.keyed and not isinstance(node, SinkNode)]
    for node in [*keyed, *sinks, *others]:
        if node.explicit_uid is not None:
            continue
        base = candidate = derived_uid(node)
        repeat = 1
        while candidate in owner:
            repeat += 1
            candidate = f"{base}#{repeat}"
        owner[candidate] = node
        uids[node.id] = candidate
    return uids


def ambiguous_keyed(nodes: Sequence[Node]) -> list[list[Node]]:
    """Keyed operators without an explicit uid that share a name and keys, in groups."""
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        if node.keyed and node.explicit_uid is None:
            groups.setdefault(derived_uid(node), []).append(node)
    return [group for group in groups.values() if len(group) > 1]


def check_uid(uid: object) -> str:
    """A uid as given by the user: a non-empty string without '/' (kept for keyflow's own
    ids, such as an operator's ``<uid>/dead-letters`` sink)."""
    if not isinstance(uid, str) or not uid.strip() or "/" in uid:
        raise PlanError(f"uid {uid!r} is invalid; give a non-empty string without '/', such as uid('per-user-totals')")
    return uid
