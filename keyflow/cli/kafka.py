"""``keyflow kafka broker``: a local Apache Kafka broker to try Kafka pipelines on one machine."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from keyflow.cli.errors import user_errors

kafka_app = typer.Typer(help="A local Apache Kafka broker (KRaft, one node, loopback).", no_args_is_help=True)


@kafka_app.command("broker")
def broker(
    port: Annotated[int, typer.Option("--port", help="Port of its PLAINTEXT listener on 127.0.0.1.")] = 9092,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Data directory (kept: a restart keeps the topics); default a temp dir."),
    ] = None,
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="Create a topic NAME[:PARTITIONS] (repeatable).")
    ] = None,
) -> None:
    """Run a broker until Ctrl-C (its jars: scripts/fetch-jvm.sh); it stops with this command."""
    from keyflow.runtime.kafka_broker import LocalBroker

    with user_errors(), LocalBroker(directory, port) as running:
        for spec in topic or []:
            name, _, partitions = spec.partition(":")
            running.create_topic(name, int(partitions or 1))
        typer.echo(
            f"Kafka broker on {running.bootstrap_servers} (data and broker.log in {running.directory}); Ctrl-C stops it"
        )
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        try:
            while not stopped.wait(1) and running.process is not None and running.process.poll() is None:
                pass
        except KeyboardInterrupt:
            pass
