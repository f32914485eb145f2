"""Draw docs/img/scheduler-*.png: one timeline per adaptive-scheduler option, from the
real state machine on a simulated clock (no Spark), so the pictures match the code.

Run: .venv/bin/python docs/scheduler_timelines.py [OUTPUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from keyflow.cli.timeline import draw
from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig
from keyflow.scheduler.timeline import decision_record, resources_record, start_record, timeline


def simulate(config: SchedulerConfig, slots_at: dict[float, int], end: float) -> list[dict[str, Any]]:
    """Slots change at the given seconds; the scheduler ticks every 0.5 s until ``end``."""
    now = [0.0]
    scheduler = AdaptiveScheduler(config, lambda: now[0])
    records = [start_record(0.0, config, "docs")]
    scheduler.start()
    for step in range(int(end * 2) + 1):
        now[0] = step / 2
        if now[0] in slots_at:
            records.append(resources_record(now[0], slots_at[now[0]], [], []))
            scheduler.on_resources(slots_at[now[0]])
        scheduler.tick()
    records += [decision_record(event) for event in scheduler.events]
    return sorted(records, key=lambda record: record["time"])


SCENARIOS = {
    "scaling-interval-min": (
        "scaling-interval.min = 30 s: new slots wait for the cooldown's check (40 s, 80 s); restarts stabilize 10 s",
        SchedulerConfig(max_parallelism=128, scaling_interval_min=30),
        {0: 2, 15: 3, 25: 4, 45: 5, 65: 6},
        100,
    ),
    "scaling-interval-max": (
        "scaling-interval.max = 60 s (min-parallelism-increase = 3): +1 at 40 s is forced at 90 s, runs at 100 s",
        SchedulerConfig(
            max_parallelism=128, scaling_interval_min=20, scaling_interval_max=60, min_parallelism_increase=3
        ),
        {0: 2, 40: 3},
        120,
    ),
    "min-parallelism-increase": (
        "min-parallelism-increase = 3 (max = 90 s): +1 waits, +3 restarts at once (60 s), the next +1 forced (180 s)",
        SchedulerConfig(
            max_parallelism=128, scaling_interval_min=20, scaling_interval_max=90, min_parallelism_increase=3
        ),
        {0: 2, 40: 3, 60: 5, 100: 6},
        200,
    ),
    "resource-stabilization-timeout": (
        "resource-stabilization-timeout = 10 s: the deadline set at the loss (30 s) holds; runs at 2 at 40 s",
        SchedulerConfig(max_parallelism=128, resource_stabilization_timeout=10),
        {0: 4, 30: 3, 35: 2},
        60,
    ),
    "resource-wait-timeout": (
        "resource-wait-timeout = 30 s: no slot at all for 30 s and the job fails",
        SchedulerConfig(max_parallelism=128, resource_stabilization_timeout=5, resource_wait_timeout=30),
        {0: 2, 20: 0},
        60,
    ),
}


def main(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, (title, config, slots_at, end) in SCENARIOS.items():
        draw(timeline(simulate(config, slots_at, end), now=end), str(directory / f"scheduler-{name}.png"), title)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "img")
