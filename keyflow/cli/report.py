"""The executed plan as one self-contained HTML page (``keyflow run/plan --report out.html``):
vertices with their parallelism (decided, for keyed stages of a batch run with
auto-parallelism), edges with their partitioner, and each decided stage's subtask loads as
bars (matplotlib, inlined as SVG: the page needs no network and no script)."""

from __future__ import annotations

import io
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
.vertex { border: 1px solid #888; border-radius: 6px; padding: .6em 1em; margin: .4em 0; display: inline-block;
          min-width: 28em; background: #f7f7fb; }
.vertex .p { float: right; font-weight: bold; }
.decided { color: #0a5; }
.edge { margin: .1em 0 .1em 2em; color: #555; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ccc; padding: .2em .6em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.warn { color: #b50; }
"""


_PLAN_ONLY = (
    "<p>A plan, not a run: in a batch run with auto-parallelism, keyed operators without a parallelism of "
    "their own (and what follows them) get theirs from their input's bytes.</p>"
)


def render_report(
    plan: dict[str, Any], stages: list[dict[str, Any]], title: str, ran: dict[int, int] | None = None
) -> str:
    """The page for a job graph (``JobGraph.to_dict()``) and the stage reports of a run;
    ``ran``: the parallelism each operator ran at (None: a plan, not run)."""
    decided = {stage["operator_id"]: stage for stage in stages}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>max parallelism (key groups): {plan['max_parallelism']}; default parallelism "
        f"{plan['default_parallelism']}</p>",
        "<h2>Vertices and edges</h2>",
    ]
    if ran is None:
        parts.append(_PLAN_ONLY)
    for vertex in plan["vertices"]:
        parts.append(_vertex(vertex, decided, ran or {}))
        for edge in plan["edges"]:
            if edge["source"] == vertex["id"]:
                keys = f" by {', '.join(edge['keys'])}" if edge.get("keys") else ""
                parts.append(f"<div class='edge'>&darr; {escape(edge['partitioner'])}{escape(keys)} "
                             f"to vertex {edge['target']}</div>")  # fmt: skip
    for stage in stages:
        parts.append(_stage(stage))
    if not stages:
        parts.append("<p>No keyed stage was sized from its input (a plan only, a streaming run, or "
                     "auto-parallelism off).</p>")  # fmt: skip
    parts.append("</body></html>")
    return "\n".join(parts)


def _vertex(vertex: dict[str, Any], decided: dict[int, dict[str, Any]], ran: dict[int, int]) -> str:
    chosen = [decided[op["id"]] for op in vertex["operators"] if op["id"] in decided]
    if chosen:
        stage = chosen[0]
        parallelism = (
            f"<span class='p decided'>parallelism {stage['parallelism']} (decided: {escape(stage['reason'])})</span>"
        )
    else:
        first = vertex["operators"][0]["id"]
        parallelism = f"<span class='p'>parallelism {ran.get(first, vertex['parallelism'])}</span>"
    operators = "<br>".join(f"{escape(op['kind'])} <b>{escape(op['name'])}</b>" for op in vertex["operators"])
    return f"<div class='vertex' id='vertex-{vertex['id']}'>{parallelism}vertex {vertex['id']}<br>{operators}</div>"


def _stage(stage: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td class='n'>{s['subtask']}</td><td class='n'>{s['key_groups'][0]}&ndash;{s['key_groups'][1]}</td>"
        f"<td class='n'>{s['bytes']:,}</td><td class='n'>{_count(s['rows'])}</td></tr>"
        for s in stage["subtasks"]
    )
    oversized = "".join(
        f"<p class='warn'>key groups {a}&ndash;{b} (one subpartition) hold more than the mean load per subtask: "
        "a subtask reads whole subpartitions, so this block bounds the largest load</p>"
        for a, b in stage["oversized_subpartitions"]
    )
    return (
        f"<h2 id='stage-{stage['operator_id']}'>Keyed stage &ldquo;{escape(stage['operator'])}&rdquo;</h2>"
        f"<p>input {stage['input_bytes']:,} bytes, {stage['input_rows']:,} rows; broadcast "
        f"{stage['broadcast_bytes']:,} bytes; decided parallelism <b>{stage['parallelism']}</b> "
        f"({escape(stage['reason'])}; the formula gave {stage['formula_parallelism']}); max/mean load "
        f"<b>{stage['max_to_mean']:.2f}</b></p>{oversized}"
        f"<table><tr><th>subtask</th><th>key groups</th><th>bytes</th><th>rows</th></tr>{rows}</table>"
        f"{_bars(stage)}"
    )


def _count(rows: int | None) -> str:
    return "" if rows is None else f"{rows:,}"


def _bars(stage: dict[str, Any]) -> str:
    loads = [s["bytes"] for s in stage["subtasks"]]
    figure, axes = plt.subplots(figsize=(min(4 + 0.4 * len(loads), 12), 2.8))
    axes.bar(range(len(loads)), loads, color="#4a7bd0", width=0.6)
    mean = sum(loads) / len(loads)
    axes.axhline(mean, color="#b50", linestyle="--")
    axes.set_title(f"bytes per subtask (dashed: the mean, {mean:,.0f} bytes)", fontsize=9)
    axes.set_xlabel("subtask")
    axes.set_ylabel("bytes read")
    axes.set_xticks(range(len(loads)))
    figure.tight_layout()
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    plt.close(figure)
    text = svg.getvalue()
    return text[text.index("<svg") :]
