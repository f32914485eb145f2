"""``keyflow sql FILE.sql``: run a SQL script (bounded sources: a batch job; unbounded: a stream)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from keyflow.cli.errors import user_errors
from keyflow.cli.pipelines import ConfigFileOption, ConfOption, execute, overrides
from keyflow.errors import KeyflowError

if TYPE_CHECKING:
    from keyflow.api.pipeline import Pipeline
    from keyflow.sql.planner import Planned


def sql(
    file: Annotated[str, typer.Argument(help="SQL script: CREATE TABLE, SET, INSERT INTO, EXPLAIN statements.")],
    conf: ConfOption = None,
    config: ConfigFileOption = None,
    parallelism: Annotated[int | None, typer.Option("--parallelism", "-p", help="parallelism.default")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Checkpoint directory or URI of a streaming run.")
    ] = None,
    available_now: Annotated[
        bool, typer.Option("--available-now", help="Streaming: process the data there now, then stop.")
    ] = False,
) -> None:
    """Run a SQL script: EXPLAIN statements print their plan; the INSERT INTO statements run as
    one job (several INSERTs, or EXECUTE STATEMENT SET BEGIN … END, share their sources).

    ``--conf`` wins over the script's SET statements."""
    with user_errors():
        pipeline, planned = load_script(file, overrides(conf, config, parallelism))
    for explained in planned.explained:
        typer.echo(explained)
    if planned.query is not None:
        raise typer.Exit(_refuse_bare_select())
    if planned.inserts:
        execute(pipeline, checkpoint, available_now, as_json)
    elif not planned.explained:
        typer.echo(f"error: {file} has no INSERT INTO statement; nothing to run", err=True)
        raise typer.Exit(2)


def load_script(file: str, settings: dict[str, object]) -> tuple[Pipeline, Planned]:
    """The pipeline a SQL script plans (every statement checked; nothing runs, no JVM starts)."""
    from keyflow.api.pipeline import Pipeline, config_overrides
    from keyflow.sql.planner import plan_script

    path = Path(file)
    if not path.is_file():
        raise KeyflowError(f"SQL file {file} does not exist; pass a .sql script")
    with config_overrides(settings):
        pipeline = Pipeline()
        return pipeline, plan_script(pipeline.builder, path.read_text())


def _refuse_bare_select() -> int:
    typer.echo(
        "error: a bare SELECT has nowhere to go in a script; write it to a table: "
        "CREATE TABLE out (…) WITH ('connector' = 'print'); INSERT INTO out SELECT …",
        err=True,
    )
    return 2
