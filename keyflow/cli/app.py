"""Entry point: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from keyflow.cli.checkpoints import checkpoints
from keyflow.cli.kafka import kafka_app
from keyflow.cli.keygroups import keygroups
from keyflow.cli.log import log_app
from keyflow.cli.pipelines import plan, run
from keyflow.cli.sql import sql
from keyflow.cli.timeline import timeline

app = typer.Typer(
    name="keyflow",
    help="Keyed, stateful pipelines on Apache Spark with Flink's parallelism model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(name="keygroups")(keygroups)
app.command(name="plan")(plan)
app.command(name="run")(run)
app.command(name="sql")(sql)
app.command(name="checkpoints")(checkpoints)
app.command(name="timeline")(timeline)
app.add_typer(log_app, name="log")
app.add_typer(kafka_app, name="kafka")


def main() -> None:
    app()
