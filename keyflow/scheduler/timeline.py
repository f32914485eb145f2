"""The scheduler's log (``scheduler.jsonl`` next to a checkpoint) and the timeline read from it.

One JSON object per line, three kinds:

- ``start``: a run began; the scheduler's options (seconds) and the run id.
- ``resources``: the slots (executor cores) changed; executors added and lost.
- ``decision``: a scheduler event (state, slots, parallelism from → to, reason, due time of a
  scheduled rescale).

A timeline turns these into step series (slots, parallelism) and shaded windows: the cooldown
after each rescale, a rescale waiting for its due time (the cooldown's check, or a forced
rescale), and waits for resources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from keyflow.errors import DamagedCheckpointError
from keyflow.scheduler.adaptive import Decision, SchedulerConfig, State

LOG_FILE = "scheduler.jsonl"


def start_record(time: float, config: SchedulerConfig, run_id: str) -> dict[str, Any]:
    return {"kind": "start", "time": time, "run_id": run_id, "config": asdict(config)}


def resources_record(time: float, slots: int, added: Sequence[str], lost: Sequence[str]) -> dict[str, Any]:
    return {"kind": "resources", "time": time, "slots": slots, "added": list(added), "lost": list(lost)}


def decision_record(decision: Decision) -> dict[str, Any]:
    return {
        "kind": "decision",
        "time": decision.time,
        "state": str(decision.state),
        "slots": decision.available_slots,
        "from": decision.parallelism_from,
        "to": decision.parallelism_to,
        "reason": decision.reason,
        "due": decision.due,
    }


@dataclass(frozen=True)
class Window:
    """A shaded span: ``cooldown``, ``scheduled`` (a rescale waits for its due time) or ``waiting``."""

    kind: str
    start: float
    end: float


@dataclass
class Run:
    """One run of a job on the checkpoint: its series and windows, times in seconds (epoch)."""

    start: float
    end: float
    cooldown: float
    slots: list[tuple[float, int]] = field(default_factory=list)
    parallelism: list[tuple[float, int]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def timeline(records: Iterable[Mapping[str, Any]], now: float | None = None) -> list[Run]:
    """The runs in a scheduler log, oldest first; a last run that has not finished ends at ``now``."""
    runs: list[Run] = []
    for record in records:
        kind, time = record.get("kind"), float(record["time"])
        if kind == "start":
            runs.append(Run(time, time, float(record["config"]["scaling_interval_min"])))
            continue
        if not runs:
            raise DamagedCheckpointError(
                f"the scheduler log ({LOG_FILE}) does not begin with a 'start' record; it was edited"
            )
        run = runs[-1]
        run.end = max(run.end, time)
        if kind == "resources":
            run.slots.append((time, int(record["slots"])))
        elif kind == "decision":
            run.decisions.append(dict(record))
            if not run.parallelism or run.parallelism[-1][1] != record["to"]:
                run.parallelism.append((time, int(record["to"])))
    if runs and now is not None and not any(d["state"] == State.FINISHED for d in runs[-1].decisions):
        runs[-1].end = max(runs[-1].end, now)
    for run in runs:
        run.windows = _windows(run.decisions, run.cooldown, run.end)
    return runs


def _windows(decisions: list[dict[str, Any]], cooldown: float, end: float) -> list[Window]:
    """Waiting for resources: until the state changes. Cooldown: from entering Executing or a
    rescale, for ``scaling-interval.min``. Scheduled (new slots wait for the cooldown's check,
    or a small increase for its forced rescale): from the first decision that names a due
    time to that time, unless something else happens first."""
    waiting, executing = str(State.WAITING_FOR_RESOURCES), str(State.EXECUTING)
    windows: list[Window] = []
    for index, decision in enumerate(decisions):
        time, state, later = float(decision["time"]), decision["state"], decisions[index + 1 :]
        entered = index == 0 or decisions[index - 1]["state"] != state
        if state == waiting and entered:
            windows.append(Window("waiting", time, _until(later, lambda d: d["state"] != waiting, end)))
        elif state == executing and (entered or decision["from"] != decision["to"]):
            stop = _until(later, lambda d: d["state"] != executing or d["from"] != d["to"], end)
            windows.append(Window("cooldown", time, min(time + cooldown, stop)))
        elif state == executing and decision.get("due") is not None:
            due = float(decision["due"])
            if any(w.kind == "scheduled" and w.end == due and w.start <= time for w in windows):
                continue  # the same rescale, awaited since an earlier decision
            stop = _until(later, lambda d: d["state"] != executing or d["from"] != d["to"], end)
            windows.append(Window("scheduled", time, min(due, stop)))
    return windows


def _until(later: list[dict[str, Any]], stops: Callable[[dict[str, Any]], Any], end: float) -> float:
    """The time of the first later decision that ``stops`` a window, else ``end``."""
    return next((float(d["time"]) for d in later if stops(d)), end)
