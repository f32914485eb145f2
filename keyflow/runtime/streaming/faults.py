"""Fault injection for crash tests: kill the driver at a named point of a micro-batch."""

from __future__ import annotations

import os
import signal

FAULT_ENV = "KEYFLOW_FAULT"
"""``<point>:<batch>``, e.g. ``after-commit:2``: SIGKILL this process there (no clean-up),
like a lost driver. Points: ``start``, ``after-sink-write``, ``after-commit``, ``after-publish``."""


def fault(point: str, batch: int) -> None:
    if os.environ.get(FAULT_ENV) == f"{point}:{batch}":
        os.kill(os.getpid(), signal.SIGKILL)
