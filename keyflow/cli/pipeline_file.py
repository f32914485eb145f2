"""Load a pipeline from a user's Python file, with CLI configuration on top."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keyflow.api.pipeline import Pipeline, config_overrides
from keyflow.errors import KeyflowError


def load_pipeline(path: str, overrides: Mapping[str, Any]) -> Pipeline:
    """Import ``path`` (its ``__main__`` block does not run) and return its one ``Pipeline``."""
    file = Path(path)
    if not file.is_file():
        raise KeyflowError(f"pipeline file {path} does not exist; pass the .py file that builds the Pipeline")
    spec = importlib.util.spec_from_file_location(f"keyflow_user_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise KeyflowError(f"cannot import {path}; it must be a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))
    try:
        with config_overrides(overrides):
            spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    found = {name: value for name, value in vars(module).items() if isinstance(value, Pipeline)}
    if len(found) != 1:
        what = f"{len(found)} ({', '.join(found)})" if found else "none"
        raise KeyflowError(
            f"{path} must define exactly one Pipeline at module level, found {what}; "
            "assign it to a module variable such as `pipeline = Pipeline(...)`"
        )
    return next(iter(found.values()))
