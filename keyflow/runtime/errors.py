"""Turn Spark's exceptions into one clear keyflow error.

Spark wraps worker failures in JVM stack traces several screens long; the message users
need is the keyflow line inside, or the first line of Spark's own error class message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from keyflow.errors import WORKER_ERROR_MARKER, KeyflowError, PipelineError

T = TypeVar("T")

_READ_FAILURE = re.compile(r"Encountered error while reading file (\S+?)\.?\s")
_MALFORMED = re.compile(r"Malformed records are detected in record parsing")
_PYTHON_ERROR = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Invalid)): (.+)$", re.MULTILINE)


def translate(error: Exception, operator: str | None = None, markers: tuple[str, ...] = ()) -> PipelineError:
    """``markers``: texts the caller resolves itself; the error then starts with the line at
    the first of them found (anywhere in the JVM trace, causes included)."""
    text = str(error)
    marker = text.find(WORKER_ERROR_MARKER)
    if marker >= 0:
        line = text[marker + len(WORKER_ERROR_MARKER) :].splitlines()[0]
        return PipelineError(line.strip())
    for found in (text.find(marker) for marker in markers):
        if found >= 0:
            return PipelineError(text[found:].splitlines()[0])
    where = f"{operator}: " if operator else ""
    read = _READ_FAILURE.search(text)
    if read:
        cause = "a malformed record" if _MALFORMED.search(text) else "the file is unreadable or corrupt"
        return PipelineError(
            f"{where}cannot read input file {read.group(1)} ({cause}); fix or remove the file "
            f"(for JSON/CSV, files(..., mode='PERMISSIVE') keeps bad records as nulls instead)"
        )
    if "exception was thrown from the Python worker" in text or "Traceback (most recent call last)" in text:
        raised = _PYTHON_ERROR.findall(text)
        if raised:
            kind, message = raised[-1]
            return PipelineError(f"{where}a Python worker raised {kind.rsplit('.', 1)[-1]}: {message.strip()}")
    return PipelineError(f"{where}{first_line(text)}")


def first_line(text: str) -> str:
    """Spark's message without SQLSTATE lines, query context and JVM frames."""
    for line in text.strip().splitlines():
        line = line.strip().removeprefix(": ")  # Py4J's ": <exception>" after its own line
        if line and not line.startswith(("SQLSTATE", "==", "at ", "JVM stacktrace", "An error occurred while calling")):
            return line
    return text.strip()


def guarded(action: Callable[[], T], where: str, markers: tuple[str, ...] = ()) -> T:
    """Run a Spark action; turn its failure into one clear keyflow error naming ``where``."""
    try:
        return action()
    except KeyflowError:
        raise
    except Exception as error:
        raise translate(error, where, markers) from None
