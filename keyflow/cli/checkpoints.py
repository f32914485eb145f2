"""``keyflow checkpoints DIR``: what a streaming checkpoint holds, whether it is intact, and
rolling it back to an earlier version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from keyflow.cli.errors import user_errors

if TYPE_CHECKING:
    from keyflow.state.checkpoint import Checkpoint


def checkpoints(
    directory: Annotated[str, typer.Argument(help="Checkpoint directory or URI.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    check: Annotated[
        bool, typer.Option("--verify", help="Check every retained version: manifests, files and sizes (no data read).")
    ] = False,
    deep: Annotated[bool, typer.Option("--deep", help="With --verify: check content checksums too.")] = False,
    rollback: Annotated[
        int | None,
        typer.Option("--rollback", metavar="VERSION", help="List what rolling back to VERSION changes."),
    ] = None,
    apply: Annotated[bool, typer.Option("--apply", help="With --rollback: make those changes.")] = False,
) -> None:
    """Versions, operators, max parallelism, parallelism history, state bytes and keys per
    operator; --verify checks integrity; --rollback VERSION [--apply] rolls back."""
    from keyflow.state.checkpoint import Checkpoint  # pyarrow: only for this command

    with user_errors():
        if deep and not check:
            raise typer.BadParameter("--deep goes with --verify", param_hint="--deep")
        if apply and rollback is None:
            raise typer.BadParameter("--apply goes with --rollback VERSION", param_hint="--apply")
        checkpoint = Checkpoint(directory)
        _not_a_checkpoint_unless_one(checkpoint)
        if rollback is not None:
            with _locked(checkpoint):
                _rollback(checkpoint, rollback, apply, as_json)
        elif check:
            with _locked(checkpoint):  # a running job's commits and retention change what is checked
                _verify(checkpoint, deep, as_json)
        else:
            _describe(checkpoint, as_json)


def _not_a_checkpoint_unless_one(checkpoint: Checkpoint) -> None:
    from keyflow.errors import CheckpointError
    from keyflow.state.plan_file import PLAN_FILE

    if not checkpoint.exists(PLAN_FILE) and not checkpoint.manifests.versions():
        raise CheckpointError(
            f"{checkpoint.uri} is not a keyflow checkpoint (no {PLAN_FILE}, no manifests); give the directory "
            "passed to run(checkpoint=...) or --checkpoint"
        )


def _verify(checkpoint: Checkpoint, deep: bool, as_json: bool) -> None:
    from keyflow.state.integrity import verify

    verification = verify(checkpoint, deep=deep)
    problem = verification.error()
    if as_json:
        versions = [
            {"version": c.version, "intact": c.intact, "damage": str(c.damage) if c.damage else None}
            for c in verification.versions
        ]
        plan = str(verification.plan_damage) if verification.plan_damage else None
        described = {"checkpoint": checkpoint.uri, "deep": deep, "plan_file_damage": plan, "versions": versions,
                     "newest_intact": verification.newest_intact, "error": problem}  # fmt: skip
        typer.echo(json.dumps(described, indent=1))
    else:
        checked = "manifests, files, sizes and content checksums" if deep else "manifests, files and sizes"
        typer.echo(f"{checkpoint.uri}: retained versions, newest first ({checked}):")
        for c in verification.versions:
            state = "intact" if c.damage is None else f"damaged: {c.damage.file} {c.damage.problem}"
            typer.echo(f"  version {c.version}: {state}")
        if verification.plan_damage is not None:
            typer.echo(f"  {verification.plan_damage.file} {verification.plan_damage.problem}")
    if problem is not None:
        if not as_json:
            Console(stderr=True, soft_wrap=True, highlight=False).print(f"[bold red]error:[/] {problem}")
        raise typer.Exit(code=1)


@contextmanager
def _locked(checkpoint: Checkpoint) -> Iterator[None]:
    """No job runs on the checkpoint meanwhile (local filesystems: object stores have no locks)."""
    from keyflow.paths import unlock

    held = checkpoint.acquire()
    try:
        yield
    finally:
        unlock(held)


def _rollback(checkpoint: Checkpoint, version: int, apply: bool, as_json: bool) -> None:
    from keyflow.state.rollback import plan_rollback

    rollback = plan_rollback(checkpoint, version)
    changes = rollback.changes()
    if apply:
        rollback.apply()
    if as_json:
        typer.echo(json.dumps({"version": version, "applied": apply, "changes": changes}, indent=1))
        return
    verb = "rolled back" if apply else "rolling back would change"
    typer.echo(f"{checkpoint.uri}: {verb} to version {version}:" if changes else f"version {version} is current")
    for line in changes:
        typer.echo(f"  {line}")
    if changes and not apply:
        typer.echo("nothing changed: add --apply to do it")


def _describe(checkpoint: Checkpoint, as_json: bool) -> None:
    from keyflow.errors import DamagedCheckpointError, DamagedFileError
    from keyflow.state.inspect import describe_checkpoint
    from keyflow.state.integrity import verify

    try:
        described = describe_checkpoint(checkpoint)
    except DamagedFileError as damage:  # plan.json: say what the way back is
        raise DamagedCheckpointError(verify(checkpoint, every_version=False).error() or str(damage)) from None
    if as_json:
        typer.echo(json.dumps(described, indent=1))
        return
    _print_described(described)


def _print_described(described: dict[str, Any]) -> None:
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
    for damaged in described["damaged"]:
        console.print(f"[red]{damaged}[/] (keyflow checkpoints {described['checkpoint']} --verify)")
    operators = Table("uid", "operator", "kind", "keys", "keys stored", "state bytes", "files (full)")
    for op in described["operators"]:
        operators.add_row(
            str(op["uid"]), op["name"], op["kind"], ", ".join(op["keys"] or []), f"{op['keys_stored']:,}",
            f"{op['state_bytes']:,}", f"{op['state_files']} ({op['full_files']})",
        )  # fmt: skip
    console.print(operators)
    for mark in described["watermarks"]:
        splits = ", ".join(f"{split}: {latest or '-'}" for split, latest in mark["split_event_times"].items())
        watermark = mark["watermark"] or "none yet"
        console.print(f"watermark of {mark['source']!r}: {watermark} (newest event time per split: {splits})")
    history = Table("time", "batch", "from", "to", "reason", title="parallelism changes")
    for event in described["events"]:
        if event.get("event", "rescale") == "rescale":
            history.add_row(event["time"], str(event["batch"]), str(event["from"]), str(event["to"]), event["reason"])
    console.print(history if history.row_count else "parallelism changes: none")
    for event in described["events"]:
        if event.get("event") == "rollback":
            console.print(f"{event['time']}: {event['reason']}")
