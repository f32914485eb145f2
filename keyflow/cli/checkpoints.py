"""``keyflow checkpoints DIR``: what a streaming checkpoint holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from keyflow.cli.errors import user_errors


def checkpoints(
    directory: Annotated[str, typer.Argument(help="Checkpoint directory or URI.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Versions, operators, max parallelism, parallelism history, state bytes and keys per operator."""
    from keyflow.state.checkpoint import Checkpoint  # pandas and pyarrow: only for this command
    from keyflow.state.inspect import describe_checkpoint

    with user_errors():
        described = describe_checkpoint(Checkpoint(directory))
    if as_json:
        typer.echo(json.dumps(described, indent=1))
        return
    console = Console(highlight=False)
    console.print(
        f"pipeline [bold]{described['pipeline']}[/]: max parallelism {described['max_parallelism']} "
        f"(key groups), key hash {described['key_hash']}"
    )
    versions = Table("version", "parallelism", "committed", title="retained versions (newest last)")
    for version in described["versions"]:
        created = datetime.fromtimestamp(version["created"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        versions.add_row(str(version["version"]), str(version["parallelism"]), created)
    console.print(versions)
    operators = Table("uid", "operator", "kind", "keys", "keys stored", "state bytes", "files (full)")
    for op in described["operators"]:
        operators.add_row(
            str(op["uid"]), op["name"], op["kind"], ", ".join(op["keys"] or []), f"{op['keys_stored']:,}",
            f"{op['state_bytes']:,}", f"{op['state_files']} ({op['full_files']})",
        )  # fmt: skip
    console.print(operators)
    history = Table("time", "batch", "from", "to", "reason", title="parallelism changes")
    for event in described["events"]:
        history.add_row(event["time"], str(event["batch"]), str(event["from"]), str(event["to"]), event["reason"])
    console.print(history if described["events"] else "parallelism changes: none")
