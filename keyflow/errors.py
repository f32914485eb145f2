"""Errors users see. Each names the thing, the value and the fix."""

from __future__ import annotations


class KeyflowError(ValueError):
    """Base of keyflow's user-facing errors (a ValueError: bad input, not a bug)."""


class PlanError(KeyflowError):
    """The pipeline cannot be compiled: bad parallelism, unknown operator option, ...

    One error may hold several ``problems`` (one line each): a plan is checked whole, so a
    user fixes every mistake in one round, not one per run."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class PipelineError(KeyflowError):
    """The pipeline failed while running on Spark: bad input data, a user function failed, ..."""


WORKER_ERROR_MARKER = "[keyflow] "
"""Prefix of errors raised inside Spark's Python workers, so the driver can find them in
Spark's wrapped traceback and show just the message."""


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
