"""Scalar functions a pipeline's expressions may call by name (Flink's user-defined
functions, ``CREATE FUNCTION … LANGUAGE PYTHON``). Pure: the runtime registers them with Spark.

A function is vectorised, as PyFlink's pandas UDFs: it receives one pandas Series per
argument and returns a Series of ``result_type`` values, so no Python loop runs per row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keyflow.errors import PlanError

RESULT_TYPE = "__keyflow_result_type__"


@dataclass(frozen=True)
class ScalarFunction:
    name: str
    function: Callable[..., Any]
    result_type: str  # a Spark SQL type, e.g. "BIGINT"


def udf(result_type: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a function's result type, for ``CREATE FUNCTION`` and ``register_function``:
    ``@udf("BIGINT")`` over ``def count_char(text: pd.Series, char: pd.Series) -> pd.Series``."""

    def declare(function: Callable[..., Any]) -> Callable[..., Any]:
        setattr(function, RESULT_TYPE, result_type)
        return function

    return declare


def scalar_function(name: str, function: object, result_type: str | None = None) -> ScalarFunction:
    """A checked function: an identifier, a callable, a result type (given or declared by ``udf``)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise PlanError(f"function name {name!r} must be an identifier such as 'count_char'")
    if not callable(function):
        raise PlanError(f"function {name!r} is {function!r}, not a callable; pass a function of pandas Series")
    declared = result_type or getattr(function, RESULT_TYPE, None)
    if not isinstance(declared, str) or not declared.strip():
        raise PlanError(
            f"function {name!r} has no result type; pass result_type='BIGINT' or declare it with @keyflow.udf('BIGINT')"
        )
    return ScalarFunction(name, function, declared.strip())


def imported(path: str, what: str) -> object:
    """The object at ``package.module.attribute`` (Python's import; no Spark)."""
    module, _, attribute = path.rpartition(".")
    if not module:
        raise PlanError(f"{what}: {path!r} is not a path such as 'package.module.function'")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise PlanError(f"{what}: cannot import {path!r} ({error}); is its module on the PYTHONPATH?") from None
