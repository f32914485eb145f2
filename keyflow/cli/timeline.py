"""``keyflow timeline DIR [--png FILE]``: what the adaptive scheduler saw and decided."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from keyflow.cli.errors import user_errors
from keyflow.scheduler.timeline import Run
from keyflow.scheduler.timeline import timeline as read_timeline

WINDOW_STYLE = {
    "cooldown": {"color": "tab:orange", "alpha": 0.18, "label": "cooldown (scaling-interval.min)"},
    # Hatched, not filled: it overlaps the cooldown whose end it waits for.
    "scheduled": {
        "fill": False,
        "edgecolor": "tab:purple",
        "alpha": 0.5,
        "hatch": "//",
        "label": "rescale due (cooldown check or forced)",
    },
    "waiting": {"color": "tab:red", "alpha": 0.15, "label": "waiting for resources"},
}


def timeline(
    directory: Annotated[str, typer.Argument(help="Checkpoint directory or URI of an adaptive job.")],
    png: Annotated[str | None, typer.Option("--png", help="Also draw the timeline to this PNG file.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: the log records and the runs read from them.")
    ] = False,
) -> None:
    """Slots, parallelism and every decision of the adaptive scheduler, per run."""
    from keyflow.state.checkpoint import Checkpoint  # pandas and pyarrow: only for this command
    from keyflow.state.inspect import scheduler_log

    with user_errors():
        records = scheduler_log(Checkpoint(directory))
        runs = read_timeline(records)
    if as_json:
        # One object, like every other --json; runs: their series as [time, value] pairs.
        typer.echo(json.dumps({"checkpoint": directory, "records": records, "runs": [asdict(run) for run in runs]}))
    else:
        _print(runs)
    if png:
        draw(runs, png, title=f"adaptive scheduler — {directory}")
        typer.echo(f"wrote {png}", err=as_json)  # stdout stays one JSON object


def _print(runs: list[Run]) -> None:
    console = Console(highlight=False)
    origin = runs[0].start if runs else 0.0
    for number, run in enumerate(runs, 1):
        started = datetime.fromtimestamp(run.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        table = Table("t (s)", "state", "slots", "parallelism", title=f"run {number}, started {started}")
        table.add_column("reason", overflow="fold")  # long option names wrap instead of being cut
        for decision in run.decisions:
            change = f"{decision['from']} → {decision['to']}" if decision["from"] != decision["to"] else decision["to"]
            reason = decision["reason"]
            if decision.get("due") is not None:
                reason += f" (due at t={decision['due'] - origin:.1f} s)"
            table.add_row(f"{decision['time'] - origin:.1f}", decision["state"], str(decision["slots"]), str(change),
                          reason)  # fmt: skip
        console.print(table)


def draw(runs: list[Run], path: str, title: str) -> None:
    """Slots and parallelism as steps over seconds since the first run; windows shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = runs[0].start if runs else 0.0
    figure, axes = plt.subplots(figsize=(12, 4.5))
    labelled: set[str] = set()

    def label(name: str) -> str | None:
        first = name not in labelled
        labelled.add(name)
        return name if first else None

    for run in runs:
        for window in run.windows:
            style = dict(WINDOW_STYLE[window.kind])
            name = str(style.pop("label"))
            axes.axvspan(window.start - origin, window.end - origin, label=label(name), linewidth=0, **style)
        for series, style, name in (
            (run.slots, {"color": "0.55", "linewidth": 7, "alpha": 0.45}, "available slots (executor cores)"),
            (run.parallelism, {"color": "tab:blue", "linewidth": 2.2}, "parallelism"),
        ):
            if series:
                times = [t - origin for t, _ in series] + [run.end - origin]
                values = [v for _, v in series] + [series[-1][1]]
                axes.step(times, values, where="post", label=label(name), **style)  # type: ignore[arg-type]
        axes.axvline(run.start - origin, color="black", linewidth=0.8, linestyle=":", label=label("run start"))
    axes.set_xlabel("seconds since the first run started")
    axes.set_ylabel("slots / parallelism")
    axes.yaxis.get_major_locator().set_params(integer=True)
    top = max((v for run in runs for _, v in run.slots + run.parallelism), default=1)
    axes.set_ylim(0, top + 0.5)
    axes.set_title(title)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", frameon=False)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
