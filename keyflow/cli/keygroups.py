"""``keyflow keygroups``: how a parallelism splits the key groups, and how skewed it is."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from keyflow import keygroups as kg
from keyflow.cli.errors import user_errors
from keyflow.errors import KeyflowError

_FULL_TABLE_ROWS = 64
_EDGE_ROWS = 16


def keygroups(
    parallelism: Annotated[int, typer.Option("--parallelism", "-p", help="Number of parallel subtasks.")],
    max_parallelism: Annotated[
        int | None,
        typer.Option("--max-parallelism", "-k", help="Number of key groups K; default: the policy's choice."),
    ] = None,
    policy: Annotated[str, typer.Option(help="Default max-parallelism policy: keyflow or flink-legacy.")] = "keyflow",
    rescale_to: Annotated[
        str | None, typer.Option("--rescale-to", help="Parallelism range A..B to check skew after rescaling.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    full: Annotated[bool, typer.Option("--full", help="List every subtask even at high parallelism.")] = False,
) -> None:
    """Show the key-group ranges of each subtask and the skew of both default policies."""
    with user_errors():
        report = build_report(parallelism, max_parallelism, _policy(policy), _parse_range(rescale_to))
    if as_json:
        typer.echo(json.dumps(report))
    else:
        _print_report(report, full)


def build_report(
    parallelism: int, max_parallelism: int | None, policy: kg.Policy, rescale: tuple[int, int] | None
) -> dict[str, Any]:
    """Everything the command shows, as plain data (the ``--json`` output)."""
    if max_parallelism is None:
        chosen = kg.default_max_parallelism(parallelism, policy)
        reason = kg.explain_default_max_parallelism(parallelism, policy)
    else:
        kg.check_parallelism(parallelism, max_parallelism)
        chosen, reason = max_parallelism, f"set by --max-parallelism {max_parallelism}"
    ranges = [
        {"subtask": subtask, "start": start, "end": end, "count": end - start + 1}
        for subtask, (start, end) in enumerate(kg.key_group_ranges(chosen, parallelism))
    ]
    report: dict[str, Any] = {
        "max_parallelism": chosen,
        "parallelism": parallelism,
        "policy": policy if max_parallelism is None else None,
        "reason": reason,
        "skew": kg.skew(chosen, parallelism),
        "ranges": ranges,
        "policies": {name: _policy_summary(parallelism, name, rescale) for name in kg.POLICIES},
    }
    if rescale is not None:
        report["rescale"] = _rescale_summary(chosen, rescale)
        if report["rescale"] is None:
            raise KeyflowError(
                f"--rescale-to {rescale[0]}..{rescale[1]} starts above max parallelism {chosen}, and no job runs "
                f"above its max parallelism; start the range at {chosen} or lower, or raise --max-parallelism"
            )
    return report


def _policy_summary(parallelism: int, policy: kg.Policy, rescale: tuple[int, int] | None) -> dict[str, Any]:
    chosen = kg.default_max_parallelism(parallelism, policy)
    summary: dict[str, Any] = {"max_parallelism": chosen, "skew": kg.skew(chosen, parallelism)}
    if rescale is not None:
        summary["rescale"] = _rescale_summary(chosen, rescale)
    return summary


def _rescale_summary(max_parallelism: int, rescale: tuple[int, int]) -> dict[str, Any] | None:
    """Worst skew over the requested range, cut at K (``limit``); None if the range starts above K."""
    low, limit = rescale[0], min(rescale[1], max_parallelism)
    if low > limit:
        return None
    worst, at = kg.worst_rescale_skew(max_parallelism, low, limit)
    return {"from": low, "to": rescale[1], "limit": limit, "worst_skew": worst, "at_parallelism": at}


def _policy(name: str) -> kg.Policy:
    for policy in kg.POLICIES:
        if policy == name:
            return policy
    raise KeyflowError(f"--policy {name!r} is not a policy; choose one of {', '.join(kg.POLICIES)}")


def _parse_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    low, sep, high = text.partition("..")
    try:
        bounds = (int(low), int(high)) if sep else (int(low), int(low))
    except ValueError:
        bounds = (0, -1)
    if not 1 <= bounds[0] <= bounds[1]:
        raise KeyflowError(f"--rescale-to {text!r} is not a range; write it as A..B with 1 <= A <= B, e.g. 1..1024")
    return bounds


def _print_report(report: dict[str, Any], full: bool) -> None:
    console = Console(highlight=False)
    console.print(f"[bold]max parallelism (key groups):[/] {report['max_parallelism']}  ({report['reason']})")
    skew = f"{report['skew']:.3f} (max/mean key groups per subtask)"
    console.print(f"[bold]parallelism:[/] {report['parallelism']}  [bold]skew:[/] {skew}")

    ranges = report["ranges"]
    table = Table("subtask", "key groups", "count", title="subtask -> key-group range")
    shown = ranges if full or len(ranges) <= _FULL_TABLE_ROWS else [*ranges[:_EDGE_ROWS], None, *ranges[-_EDGE_ROWS:]]
    for row in shown:
        if row is None:
            table.add_row("…", f"({len(ranges) - 2 * _EDGE_ROWS} more; --full lists all)", "…")
        else:
            table.add_row(str(row["subtask"]), f"{row['start']}..{row['end']}", str(row["count"]))
    console.print(table)

    rescale = report.get("rescale")
    policies = Table("policy", "max parallelism", f"skew at p={report['parallelism']}", title="default policies")
    if rescale:
        policies.add_column(f"worst skew over p={rescale['from']}..{rescale['to']}")
    for name, summary in report["policies"].items():
        cells = [name, str(summary["max_parallelism"]), f"{summary['skew']:.3f}"]
        if rescale:
            cells.append(_rescale_cell(summary["rescale"]))
        policies.add_row(*cells)
    console.print(policies)
    if rescale:
        console.print(f"[bold]with K={report['max_parallelism']}:[/] worst skew {_rescale_cell(rescale)}")


def _rescale_cell(rescale: dict[str, Any] | None) -> str:
    if rescale is None:
        return "n/a (range starts above K)"
    cell = f"{rescale['worst_skew']:.3f} (at p={rescale['at_parallelism']})"
    if rescale["limit"] < rescale["to"]:
        cell += f", only up to p={rescale['limit']} = K"
    return cell
