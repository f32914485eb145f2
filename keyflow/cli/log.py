"""``keyflow log append``: write records into a partitioned append-only log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import typer

from keyflow.cli.errors import user_errors
from keyflow.connectors.log import Log, check_key_columns
from keyflow.errors import DataError, PlanError

log_app = typer.Typer(
    help="A partitioned append-only log on a filesystem (a stand-in for Kafka).", no_args_is_help=True
)


def _read(file: Path) -> pa.Table:
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(file)
        if suffix in (".json", ".jsonl"):
            return pa_json.read_json(file)
        if suffix == ".csv":
            return pa_csv.read_csv(file)
    except (OSError, pa.ArrowInvalid) as error:
        raise DataError(f"cannot read {file}: {error}") from None
    raise PlanError(f"--file {file}: use a .parquet, .json/.jsonl (JSON lines) or .csv file")


@log_app.command("append")
def append(
    log: Annotated[str, typer.Argument(help="Log directory (created on first append).")],
    file: Annotated[Path, typer.Option("--file", "-f", help="Records to append: .parquet, .jsonl or .csv.")],
    key: Annotated[
        list[str] | None, typer.Option("--key", "-k", help="Key column(s): a key stays in one split.")
    ] = None,
    splits: Annotated[int, typer.Option("--splits", help="Number of splits when the log is created.")] = 4,
    split: Annotated[
        int | None, typer.Option("--split", help="Append every record to this split (your own partitioner).")
    ] = None,
) -> None:
    """Append the records of FILE; a new log takes FILE's schema."""
    with user_errors():
        records = _read(file)
        if key:
            check_key_columns(key, records.schema)  # before a new log is created
        try:
            target = Log(log)
        except PlanError:
            target = Log.create(log, splits, records.schema)
        appended = target.append(records, key=key or None, split=split)
    typer.echo(f"appended {sum(appended.values()):,} records to {log} ({len(appended)} of {target.splits} splits)")


@log_app.command("add-splits")
def add_splits(
    log: Annotated[str, typer.Argument(help="Log directory.")],
    count: Annotated[int, typer.Argument(help="How many empty splits to add.")],
) -> None:
    """Add empty splits (as Kafka adds partitions); a running pre-keyed pipeline reads them too."""
    with user_errors():
        total = Log(log).add_splits(count)
    typer.echo(f"{log} now has {total} splits")


@log_app.command("describe")
def describe(log: Annotated[str, typer.Argument(help="Log directory.")]) -> None:
    """Splits, schema and records per split."""
    with user_errors():
        target = Log(log)
    typer.echo(f"{log}: {target.splits} splits, schema {target.schema.to_string(show_schema_metadata=False)}")
    for split, end in enumerate(target.end_offsets()):
        typer.echo(f"  split {split}: {end:,} records")
