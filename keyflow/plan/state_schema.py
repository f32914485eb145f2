"""What a keyed operator persists: its state schema, recorded in ``plan.json`` and compared on
restore field by field (a restore error then names what changed, in the user's words). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class StateLayout(StrEnum):
    """How a keyed operator lays out its state; a checkpoint's state can only be restored by
    an operator with the same layout."""

    PARTIALS = "partials"  # declared state (process, normalize) or merged per-batch partials
    RUNNING = "running"  # running partials merged in the worker (an aggregate after reinterpret)
    RETRACTING = "retracting"  # what retraction needs: value multisets for min, max, distinct
    WINDOWS = "windows"  # one slot per key and window: its merged partials and when it fires
    SESSIONS = "sessions"  # per key: its open sessions' bounds and partials, merged as rows bridge them
    TOP_ROWS = "top_rows"  # per key: its first rows in the Top-N's order
    ALL_ROWS = "all_rows"  # per key: every current row of a changelog, and the first ones emitted
    OVER_ROWS = "over_rows"  # per key: rows waiting for the watermark, and what the frame still needs


class KeyGroupSource(StrEnum):
    """Where a keyed operator's rows get their key group."""

    HASH = "hash"  # the key hash (key_by, or reinterpreted after a keyed operator)
    SPLITS = "splits"  # a pre-keyed source's splits (reinterpreted right after the source)


LAYOUT_VERSION = 1
"""Version of the state files' layout; a new layout of the same kind raises it."""


@dataclass(frozen=True)
class StateSchema:
    """``contents``: the declared state (name, Arrow type) of a process function, or the
    aggregates (name, expression) of an aggregate; a normalize keeps each key's last row."""

    keys: tuple[str, ...]
    contents: tuple[tuple[str, str], ...] = ()
    layout: StateLayout = StateLayout.PARTIALS
    key_groups: KeyGroupSource = KeyGroupSource.HASH
    version: int = LAYOUT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "contents": dict(self.contents),
            "layout": self.layout.value,
            "key_groups": self.key_groups.value,
            "version": self.version,
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> StateSchema:
        return StateSchema(
            keys=tuple(data["keys"]),
            contents=tuple(dict(data["contents"]).items()),
            layout=StateLayout(data["layout"]),
            key_groups=KeyGroupSource(data["key_groups"]),
            version=int(data["version"]),
        )

    @staticmethod
    def from_plan_v2(details: Mapping[str, Any]) -> StateSchema:
        """The schema a plan of format version 2 kept among an operator's display details."""
        return StateSchema(
            keys=tuple(details.get("keys", details.get("primary_key", ()))),
            contents=tuple(dict(details.get("state", details.get("aggregations", {}))).items()),
            layout=StateLayout(details.get("state_layout", StateLayout.PARTIALS)),
            key_groups=KeyGroupSource(details.get("key_groups", KeyGroupSource.HASH)),
        )
