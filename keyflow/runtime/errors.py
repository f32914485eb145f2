"""Turn Spark's exceptions into one clear keyflow error.

Spark wraps worker failures in JVM stack traces several screens long; the error users need
is the one a worker encoded inside (``keyflow.errors.decode``), or the first line of
Spark's own error class message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from keyflow.errors import DataError, EngineError, KeyflowError, PipelineError, decode

T = TypeVar("T")

_READ_FAILURE = re.compile(r"Encountered error while reading file (\S+?)\.?\s")
_MALFORMED = re.compile(r"Malformed records are detected in record parsing")
_PYTHON_ERROR = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Invalid)): (.+)$", re.MULTILINE)


def translate(error: Exception, operator: str | None = None) -> KeyflowError:
    """The keyflow error a worker encoded in ``error``, else a DataError for an unreadable
    input file, a PipelineError for a Python worker's exception, an EngineError for the rest."""
    text = str(error)
    encoded = decode(text)
    if encoded is not None:
        return encoded
    where = f"{operator}: " if operator else ""
    read = _READ_FAILURE.search(text)
    if read:
        cause = "a malformed record" if _MALFORMED.search(text) else "the file is unreadable or corrupt"
        return DataError(
            f"{where}cannot read input file {read.group(1)} ({cause}); fix or remove the file "
            f"(for JSON/CSV, files(..., mode='PERMISSIVE') keeps bad records as nulls instead)"
        )
    if "exception was thrown from the Python worker" in text or "Traceback (most recent call last)" in text:
        raised = _PYTHON_ERROR.findall(text)
        if raised:
            kind, message = raised[-1]
            return PipelineError(f"{where}a Python worker raised {kind.rsplit('.', 1)[-1]}: {message.strip()}")
    return EngineError(f"{where}{first_line(text) or type(error).__name__}")  # an empty message: at least its kind


def first_line(text: str) -> str:
    """Spark's message without SQLSTATE lines, query context and JVM frames."""
    for line in text.strip().splitlines():
        line = line.strip().removeprefix(": ")  # Py4J's ": <exception>" after its own line
        if line and not line.startswith(("SQLSTATE", "==", "at ", "JVM stacktrace", "An error occurred while calling")):
            return line
    return text.strip()


def guarded(action: Callable[[], T], where: str) -> T:
    """Run a Spark action; turn its failure into one clear keyflow error naming ``where``."""
    try:
        return action()
    except KeyflowError:
        raise
    except Exception as error:
        raise translate(error, where) from None
