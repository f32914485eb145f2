"""Durations as the API takes them (``'5 s'``, ``'1 minute'``, a ``timedelta``), in microseconds. Pure."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

from keyflow.errors import PlanError

_UNITS = {
    1: ("us", "µs", "microsecond", "microseconds"),
    1_000: ("ms", "milli", "millis", "millisecond", "milliseconds"),
    1_000_000: ("s", "sec", "secs", "second", "seconds"),
    60_000_000: ("m", "min", "mins", "minute", "minutes"),
    3_600_000_000: ("h", "hour", "hours"),
    86_400_000_000: ("d", "day", "days"),
}
MICROS = {name: micros for micros, names in _UNITS.items() for name in names}
"""Flink's duration units (``TimeUtils.parseDuration``) in microseconds."""


def duration(value: Any, what: str, zero: bool = True, signed: bool = False) -> int:
    """Microseconds from a ``timedelta``, or a string such as ``'5 s'``, ``'1 minute'``, ``'250 ms'``;
    ``signed``: a negative one too (``'-5 s'``: an interval join's bound before the row's time)."""
    if isinstance(value, timedelta):
        micros = int(value / timedelta(microseconds=1))
    elif value == 0 and not isinstance(value, bool):
        micros = 0
    else:
        match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zµ]+)\s*", str(value).lower())
        if isinstance(value, bool) or not match or match.group(2) not in MICROS:
            raise PlanError(
                f"{what}={value!r} is not a duration; write e.g. '5 s', '1 min', '250 ms', '10 us' or a "
                "datetime.timedelta" + (" (before the time: '-5 s')" if signed else "")
            )
        micros = int(Decimal(match.group(1)) * MICROS[match.group(2)])
    if (micros < 0 and not signed) or (micros == 0 and not zero):
        raise PlanError(f"{what}={value!r} must be {'zero or ' if zero else ''}positive")
    return micros
