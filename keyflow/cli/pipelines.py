"""``keyflow run`` and ``keyflow plan``: execute or show a pipeline file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from keyflow.cli.errors import user_errors
from keyflow.cli.pipeline_file import load_pipeline
from keyflow.config import AUTO_PARALLELISM_ENABLED, SCHEDULER, load_yaml, parse_conf_pairs
from keyflow.plan.event_time import iso_micros

if TYPE_CHECKING:  # the runtime loads PySpark: not for every `keyflow` command
    from keyflow.api.pipeline import Pipeline
    from keyflow.runtime.streaming import BatchMetrics, StreamingResult

ConfOption = Annotated[
    list[str] | None, typer.Option("--conf", "-c", help="Configuration key=value (repeatable); wins over the file.")
]
ConfigFileOption = Annotated[str | None, typer.Option("--config", help="YAML file of configuration keys.")]
ReportOption = Annotated[
    str | None,
    typer.Option("--report", help="Write the executed plan as a self-contained HTML page (stages, loads) here."),
]


def overrides(conf: list[str] | None, config_file: str | None, parallelism: int | None) -> dict[str, object]:
    values: dict[str, object] = dict(load_yaml(config_file)) if config_file else {}
    values.update(parse_conf_pairs(conf or []))
    if parallelism is not None:
        values["parallelism.default"] = parallelism
    return values


def plan(
    file: Annotated[str, typer.Argument(help="Python file that defines a Pipeline, or a SQL script (.sql).")],
    conf: ConfOption = None,
    config: ConfigFileOption = None,
    parallelism: Annotated[int | None, typer.Option("--parallelism", "-p", help="parallelism.default")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    report: ReportOption = None,
) -> None:
    """Print the job plan of a pipeline file (or of a SQL script's INSERTs) without running it."""
    with user_errors():
        settings = overrides(conf, config, parallelism)
        if file.endswith(".sql"):
            from keyflow.cli.sql import load_script

            pipeline = load_script(file, settings)[0]
        else:
            pipeline = load_pipeline(file, settings)
        job = pipeline.plan()
    typer.echo(job.to_json() if as_json else job.render())
    if not as_json:
        _auto_sized_line(pipeline)
    if report is not None:
        _write_report(report, job.to_dict(), [], f"{job.name}: plan")


def run(
    file: Annotated[str, typer.Argument(help="Python file that defines a Pipeline.")],
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
    report: ReportOption = None,
) -> None:
    """Run a pipeline file: print its plan, run it on Spark, summarise what was written.

    A pipeline with an unbounded source runs as a stream with exactly-once state in
    ``--checkpoint`` until interrupted (Ctrl-C stops at once; a micro-batch that was running
    is not committed and runs again on restart)."""
    with user_errors():
        pipeline = load_pipeline(file, overrides(conf, config, parallelism))
    execute(pipeline, checkpoint, available_now, as_json, report)


def execute(
    pipeline: Pipeline, checkpoint: str | None, available_now: bool, as_json: bool, report: str | None = None
) -> None:
    """Print the plan, run the pipeline (a stream with a checkpoint when a source is
    unbounded or ``checkpoint`` is given), summarise what was written."""
    console = Console(highlight=False)
    with user_errors():
        job = pipeline.plan()
        if not as_json:
            typer.echo(job.render())
            if pipeline.config.get(SCHEDULER) == "adaptive":
                typer.echo("parallelism: chosen at start by the adaptive scheduler from the executor cores")
            if checkpoint is None:
                _auto_sized_line(pipeline)
        if checkpoint is not None or pipeline.is_streaming():
            on_batch = None if as_json else _print_batch
            result = pipeline.run(checkpoint=checkpoint, available_now=available_now, on_batch=on_batch)
        else:
            result = pipeline.run()
    from keyflow.runtime.streaming import StreamingResult  # Spark is loaded by now

    if isinstance(result, StreamingResult):
        if report is not None:
            _write_report(report, job.to_dict(), [], f"{job.name}: streaming run", {})
        _streaming_summary(console, result, as_json)
        return
    stages = [stage.to_dict() for stage in result.stages]
    if report is not None:
        title = f"{job.name}: run of {result.seconds:.1f} s"
        _write_report(report, job.to_dict(), stages, title, result.parallelism)
    if as_json:
        sinks = [vars(sink) for sink in result.sinks]
        typer.echo(json.dumps({"plan": job.to_dict(), "sinks": sinks, "stages": stages, "seconds": result.seconds}))
        return
    if stages:
        console.print(_stages_table(stages))
    table = Table("written to", "rows", "seconds", title=f"{job.name}: done in {result.seconds:.1f} s")
    for sink in result.sinks:
        rows = "-" if sink.rows is None else f"{sink.rows:,}"
        table.add_row(sink.target, rows, f"{sink.seconds:.1f}")
    console.print(table)


def _auto_sized_line(pipeline: Pipeline) -> None:
    """Say which keyed operators a batch run sizes from their input (auto-parallelism)."""
    if pipeline.is_streaming() or not pipeline.config.get(AUTO_PARALLELISM_ENABLED):
        return
    names = [node.name for node in pipeline.compile().auto_sized()]
    if names:
        typer.echo(
            f"auto-parallelism: {', '.join(map(repr, names))} sized from input bytes at run time "
            "(execution.batch.adaptive.auto-parallelism.*)"
        )


def _write_report(
    path: str, plan: dict[str, Any], stages: list[dict[str, Any]], title: str, ran: dict[int, int] | None = None
) -> None:
    from keyflow.cli.report import render_report  # matplotlib loads only for a report

    Path(path).write_text(render_report(plan, stages, title, ran), encoding="utf-8")


def _stages_table(stages: list[dict[str, Any]]) -> Table:
    """Each keyed stage's decided parallelism and why, and what each subtask read."""
    table = Table("keyed operator", "input", "parallelism", "subtasks: key groups, bytes, rows", "max/mean",
                  title="auto-parallelism (execution.batch.adaptive.auto-parallelism.*)")  # fmt: skip
    for stage in stages:
        subtasks = "\n".join(
            f"{s['subtask']}: {s['key_groups'][0]}-{s['key_groups'][1]}, {_size(s['bytes'])}"
            + ("" if s["rows"] is None else f", {s['rows']:,} rows")
            for s in stage["subtasks"]
        )
        why = (
            stage["reason"]
            if stage["reason"] == "formula"
            else f"{stage['reason']}; formula {stage['formula_parallelism']}"
        )
        oversized = "".join(
            f"\nkey groups {a}-{b} (one block) above the mean" for a, b in stage["oversized_subpartitions"]
        )
        table.add_row(
            stage["operator"],
            f"{_size(stage['input_bytes'])}, {stage['input_rows']:,} rows",
            f"{stage['parallelism']} ({why})",
            subtasks,
            f"{stage['max_to_mean']:.2f}{oversized}",
        )
    return table


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


def _print_batch(batch: BatchMetrics) -> None:
    """One plain line per micro-batch, never wrapped (rich wraps at 80 columns in a pipe), so
    logs and ``grep``/``tail -f`` see whole lines."""
    written = ", ".join(f"{rows:,} to {sink}" for sink, rows in batch.output_rows.items())
    typer.echo(
        f"batch {batch.batch}: parallelism {batch.parallelism}, {_count(batch.input_rows)} rows in, {written}; "
        f"state {batch.state_bytes_written:,} bytes in {batch.state_files} files; {batch.seconds:.1f} s"
        + (f"; {batch.pre_keyed_conflicts:,} keys in two splits (warn)" if batch.pre_keyed_conflicts else "")
        + (f"; watermark {iso_micros(batch.watermark) or 'none yet'}" if batch.watermark is not None else "")
        + "".join(f"; {rows:,} late rows dropped by {name!r}" for name, rows in batch.late_rows_dropped.items())
    )


def _count(rows: int | None) -> str:
    return "?" if rows is None else f"{rows:,}"


def _streaming_summary(console: Console, result: StreamingResult, as_json: bool) -> None:
    if as_json:
        batches = [vars(batch) for batch in result.batches]
        typer.echo(json.dumps({"plan": result.plan.to_dict(), "checkpoint": result.checkpoint, "batches": batches}))
        return
    table = Table("written to", "rows", title=f"{result.plan.name}: {len(result.batches)} micro-batches committed")
    for sink, rows in result.output_rows.items():
        table.add_row(sink, f"{rows:,}")
    console.print(table)
    console.print(f"checkpoint: {result.checkpoint}  (inspect with: keyflow checkpoints {result.checkpoint})")
