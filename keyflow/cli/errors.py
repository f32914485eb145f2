"""Turn keyflow's ValueErrors into one red line and exit code 2, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

_stderr = Console(stderr=True, soft_wrap=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ValueError as error:
        _stderr.print(f"[bold red]error:[/] {error}", highlight=False)
        raise typer.Exit(code=2) from None
