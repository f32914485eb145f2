"""Durations as the API takes them (``'5 s'``, ``'1 minute'``, a ``timedelta``), in microseconds. Pure."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from keyflow.errors import PlanError

MICROS = {"us": 1, "ms": 1_000, "s": 1_000_000, "sec": 1_000_000, "second": 1_000_000, "min": 60_000_000,
          "minute": 60_000_000, "m": 60_000_000, "h": 3_600_000_000, "hour": 3_600_000_000,
          "d": 86_400_000_000, "day": 86_400_000_000}  # fmt: skip


def duration(value: Any, what: str, zero: bool = True) -> int:
    """Microseconds from a ``timedelta``, or a string such as ``'5 s'``, ``'1 minute'``, ``'250 ms'``."""
    if isinstance(value, timedelta):
        micros = int(value / timedelta(microseconds=1))
    elif value == 0 and not isinstance(value, bool):
        micros = 0
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*", str(value).lower())
        if isinstance(value, bool) or not match or match.group(2) not in MICROS:
            raise PlanError(
                f"{what}={value!r} is not a duration; write e.g. '5 s', '1 minute', '250 ms' or a datetime.timedelta"
            )
        micros = int(float(match.group(1)) * MICROS[match.group(2)])
    if micros < 0 or (micros == 0 and not zero):
        raise PlanError(f"{what}={value!r} must be {'zero or ' if zero else ''}positive")
    return micros
