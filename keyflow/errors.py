"""Errors users see, in one hierarchy, and the one line that carries them out of Spark's workers.

Each error names the thing, the value and the fix. Five families under ``KeyflowError``:
the plan, the configuration, the checkpoint, and, while running, the data, the engine or an
external system.
"""

from __future__ import annotations

import json
import re
from typing import Any

_KINDS: dict[str, type[KeyflowError]] = {}  # every error class by name, for ``decode``


class KeyflowError(ValueError):
    """Base of keyflow's user-facing errors (a ValueError: bad input, not a bug)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.__name__] = cls  # a new error class decodes from a worker without being listed

    def fields(self) -> dict[str, Any]:
        """What rebuilds this error besides its message, when a Spark worker raises it (``encode``)."""
        return {}

    @classmethod
    def rebuilt(cls, message: str, fields: dict[str, Any]) -> KeyflowError:
        """The error ``encode`` wrote as ``message`` and ``fields``."""
        return cls(message)


_KINDS[KeyflowError.__name__] = KeyflowError


class PlanError(KeyflowError):
    """The pipeline as written cannot run: bad parallelism, unknown operator option, ...

    One error may hold several ``problems`` (one line each): a plan is checked whole, so a
    user fixes every mistake in one round, not one per run."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def fields(self) -> dict[str, Any]:
        return {"problems": list(self.problems)}

    @classmethod
    def rebuilt(cls, message: str, fields: dict[str, Any]) -> KeyflowError:
        return cls(*fields["problems"])


class ConfigError(KeyflowError):
    """An invalid configuration key or value (file, dict, ``--conf`` or Spark's own check)."""


class CheckpointError(KeyflowError):
    """The checkpoint cannot be used as it is: held by another job, not a checkpoint, damaged, ..."""


class DamagedFileError(CheckpointError):
    """A checkpoint file that is not what was committed: ``file`` (relative to the checkpoint)
    ``problem`` (e.g. "is missing"); the runtime turns it into a DamagedCheckpointError."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"damaged checkpoint file {file} {problem}")
        self.file, self.problem = file, problem

    def fields(self) -> dict[str, Any]:
        return {"file": self.file, "problem": self.problem}

    @classmethod
    def rebuilt(cls, message: str, fields: dict[str, Any]) -> KeyflowError:
        return cls(fields["file"], fields["problem"])


class DamagedCheckpointError(CheckpointError):
    """A damaged checkpoint; the message names the file, the damage, the newest intact version
    and the command that rolls back to it."""


class RestoreError(CheckpointError):
    """An intact checkpoint this pipeline cannot continue from: another pipeline's, other key
    groups or hash, changed operators, state, key types or source, a source log out of step."""


class PipelineError(KeyflowError):
    """The pipeline failed while running on Spark (a user function raised, ...)."""


class DataError(PipelineError):
    """Bad input data: a malformed record, null keys under 'fail', a key outside its split's
    key groups, a user function's result that does not fit its schema."""


class NullKeysError(DataError):
    """A row with a null key under pipeline.null-keys=fail, at keyed operator ``node`` (raised
    by Spark; the driver counts the rows and raises a DataError naming the operator)."""

    def __init__(self, node: int) -> None:
        super().__init__(f"a key of operator node {node} is null")
        self.node = node

    def fields(self) -> dict[str, Any]:
        return {"node": self.node}

    @classmethod
    def rebuilt(cls, message: str, fields: dict[str, Any]) -> KeyflowError:
        return cls(fields["node"])


class EngineError(PipelineError):
    """Spark or the cluster failed: no executor cores, a Spark failure, a checkpoint workers cannot see."""


class ExternalSystemError(PipelineError):
    """A system a connector talks to failed or refused: a Kafka broker unreachable within its
    timeout, a topic that does not exist, a transaction the broker fenced."""


class WorkerError(RuntimeError):
    """How code inside Spark's workers raises a keyflow error: its message is ``encode(error)``."""

    def __init__(self, error: KeyflowError) -> None:
        super().__init__(encode(error))


_ENCODED = re.compile(r"\[keyflow:(\w+)\] ")


def encode(error: KeyflowError) -> str:
    """One line naming ``error``'s class, with its message and fields as JSON: Spark carries a
    worker's error to the driver only as text inside its own traceback."""
    return f"[keyflow:{type(error).__name__}] {json.dumps({'message': str(error), **error.fields()})}"


def decode(text: str) -> KeyflowError | None:
    """The first error ``encode`` wrote anywhere in ``text`` (e.g. Spark's wrapped traceback,
    causes included), rebuilt as its class; None if there is none."""
    for found in _ENCODED.finditer(text):
        kind = _KINDS.get(found.group(1))
        try:
            payload, _ = json.JSONDecoder().raw_decode(text, found.end())  # Spark may add text after it
        except ValueError:
            continue
        if kind is not None and isinstance(payload, dict) and isinstance(payload.get("message"), str):
            return kind.rebuilt(payload.pop("message"), payload)
    return None


def is_positive_int(value: object) -> bool:
    """A positive ``int`` (``True`` is an int in Python, but not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(value: object, what: str) -> int:
    """``value`` if it is a positive integer, else a PlanError naming ``what``."""
    if not is_positive_int(value):
        raise PlanError(f"{what}={value!r} is invalid; it must be a positive integer")
    assert isinstance(value, int)
    return value


def positive_option(value: int | None, what: str) -> int | None:
    """``value`` if it is None (not set) or a positive integer, else a PlanError naming ``what``."""
    return None if value is None else positive_int(value, what)
