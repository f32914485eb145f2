"""Load a pipeline from a user's Python file, with CLI configuration on top."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from keyflow.api.pipeline import Pipeline, config_overrides
from keyflow.errors import KeyflowError


def load_pipeline(path: str, overrides: Mapping[str, Any]) -> Pipeline:
    """Import ``path`` (its ``__main__`` block does not run) and return its one ``Pipeline``.

    The file's directory is on ``sys.path`` while it runs, so it can import modules next to
    it; those modules are then pickled by value, since Spark's Python workers cannot import
    them."""
    file = Path(path)
    if not file.is_file():
        raise KeyflowError(f"pipeline file {path} does not exist; pass the .py file that builds the Pipeline")
    spec = importlib.util.spec_from_file_location(f"keyflow_user_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise KeyflowError(f"cannot import {path}; it must be a Python file")
    module = importlib.util.module_from_spec(spec)
    directory = file.resolve().parent
    imported_before = set(sys.modules)
    sys.path.insert(0, str(directory))
    try:
        with config_overrides(overrides):
            spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    _pickle_by_value(_modules_from(directory, imported_before))
    found = {name: value for name, value in vars(module).items() if isinstance(value, Pipeline)}
    if len(found) != 1:
        what = f"{len(found)} ({', '.join(found)})" if found else "none"
        raise KeyflowError(
            f"{path} must define exactly one Pipeline at module level, found {what}; "
            "assign it to a module variable such as `pipeline = Pipeline(...)`"
        )
    return next(iter(found.values()))


def _modules_from(directory: Path, imported_before: set[str]) -> list[ModuleType]:
    """The top-level modules and packages that the file imported first, from ``directory``.

    Only those first imported by the file: keyflow itself may lie in a checkout's directory
    but is installed on the workers. The file is not in ``sys.modules``, so its own functions
    are pickled by value already."""
    found = []
    for name, module in list(sys.modules.items()):
        if "." in name or name in imported_before or not isinstance(module, ModuleType):
            continue
        # A package's __path__ is its directory (also for namespace packages); a module's its file.
        locations = list(getattr(module, "__path__", None) or [getattr(module, "__file__", None)])
        if any(location and Path(location).resolve().parent == directory for location in locations):
            found.append(module)
    return found


def _pickle_by_value(modules: list[ModuleType]) -> None:
    """Ship ``modules`` inside the pickled functions that use them (a package with all its
    submodules), so the workers need neither the files nor the directory on their path."""
    if not modules:
        return  # no PySpark import for a file without such modules
    from pyspark import cloudpickle  # the copy Spark pickles Python functions with

    for module in modules:
        cloudpickle.register_pickle_by_value(module)
