"""Checksums of checkpoint files, and JSON documents that carry their own.

A state file's checksum is computed from the bytes being written, never by reading them
back; a manifest or plan.json carries the checksum of its own content (``seal``), so a torn
or edited one is recognised as such instead of being parsed into something wrong.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash

CHECKSUM_FIELD = "checksum"


def checksum(data: bytes) -> str:
    """xxh3-64 of ``data`` as 16 hex digits (several GB/s: cheap next to writing the bytes)."""
    return xxhash.xxh3_64_hexdigest(data)


class UnsealedError(ValueError):
    """A sealed document that is not what was written: ``problem`` says how."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def seal(data: dict[str, Any]) -> str:
    """``data`` as JSON with the checksum of its canonical form added (taken after a JSON round
    trip, so what a reader parses hashes the same: tuples become lists, keys strings)."""
    return json.dumps({**data, CHECKSUM_FIELD: checksum(_canonical(as_json(data)))}, indent=1)


def as_json(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as a reader of its JSON sees it."""
    parsed: dict[str, Any] = json.loads(json.dumps(data))
    return parsed


def unseal(text: str, sealed: bool = True) -> dict[str, Any]:
    """The document in ``text``; raises UnsealedError if it is not complete JSON or (``sealed``: a
    format that carries a checksum) its content does not match its checksum."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UnsealedError(f"is torn: not complete JSON (line {error.lineno} column {error.colno})") from None
    if not isinstance(data, dict):
        raise UnsealedError("is not a keyflow document (not a JSON object)")
    recorded = data.pop(CHECKSUM_FIELD, None)
    if sealed and recorded is None:
        raise UnsealedError("has no checksum: it was edited, or written by something else")
    if recorded is not None and recorded != checksum(_canonical(data)):
        raise UnsealedError("was altered: its content does not match its own checksum")
    return data


def _canonical(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
