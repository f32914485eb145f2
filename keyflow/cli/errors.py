"""Turn keyflow's errors (``KeyflowError``: bad input, named with its fix) into one red line
per problem and exit code 2, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from keyflow.errors import KeyflowError, PlanError

_stderr = Console(stderr=True, soft_wrap=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except KeyflowError as error:
        for problem in error.problems if isinstance(error, PlanError) else (str(error),):
            _stderr.print(f"[bold red]error:[/] {problem}", highlight=False)
        raise typer.Exit(code=2) from None
