"""``keyflow run`` and ``keyflow plan``: execute or show a pipeline file."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from keyflow.cli.errors import user_errors
from keyflow.cli.pipeline_file import load_pipeline
from keyflow.config import load_yaml, parse_conf_pairs

ConfOption = Annotated[
    list[str] | None, typer.Option("--conf", "-c", help="Configuration key=value (repeatable); wins over the file.")
]
ConfigFileOption = Annotated[str | None, typer.Option("--config", help="YAML file of configuration keys.")]


def _overrides(conf: list[str] | None, config_file: str | None, parallelism: int | None) -> dict[str, object]:
    values: dict[str, object] = dict(load_yaml(config_file)) if config_file else {}
    values.update(parse_conf_pairs(conf or []))
    if parallelism is not None:
        values["parallelism.default"] = parallelism
    return values


def plan(
    file: Annotated[str, typer.Argument(help="Python file that defines a Pipeline.")],
    conf: ConfOption = None,
    config: ConfigFileOption = None,
    parallelism: Annotated[int | None, typer.Option("--parallelism", "-p", help="parallelism.default")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Print the job plan of a pipeline file without running it."""
    with user_errors():
        job = load_pipeline(file, _overrides(conf, config, parallelism)).plan()
    typer.echo(job.to_json() if as_json else job.render())


def run(
    file: Annotated[str, typer.Argument(help="Python file that defines a Pipeline.")],
    conf: ConfOption = None,
    config: ConfigFileOption = None,
    parallelism: Annotated[int | None, typer.Option("--parallelism", "-p", help="parallelism.default")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run a pipeline file: print its plan, run it on Spark, summarise what was written."""
    console = Console(highlight=False)
    with user_errors():
        pipeline = load_pipeline(file, _overrides(conf, config, parallelism))
        job = pipeline.plan()
        if not as_json:
            typer.echo(job.render())
        result = pipeline.run()
    if as_json:
        sinks = [vars(sink) for sink in result.sinks]
        typer.echo(json.dumps({"plan": job.to_dict(), "sinks": sinks, "seconds": result.seconds}))
        return
    table = Table("written to", "rows", "seconds", title=f"{job.name}: done in {result.seconds:.1f} s")
    for sink in result.sinks:
        rows = "-" if sink.rows is None else f"{sink.rows:,}"
        table.add_row(sink.target, rows, f"{sink.seconds:.1f}")
    console.print(table)
