"""The timeline read from a scheduler log: series and shaded windows, worked out by hand."""

from __future__ import annotations

import pytest

from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig
from keyflow.scheduler.timeline import Window, decision_record, resources_record, start_record, timeline


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_windows_and_series_of_a_run() -> None:
    clock = FakeClock()
    config = SchedulerConfig(max_parallelism=128, scaling_interval_min=30, resource_stabilization_timeout=10)
    scheduler = AdaptiveScheduler(config, clock)
    records = [start_record(0, config, "run")]

    def slots(time: float, count: int) -> None:
        clock.now = time
        records.append(resources_record(time, count, [], []))
        scheduler.on_resources(count)

    def tick(time: float) -> None:
        clock.now = time
        scheduler.tick()

    scheduler.start()
    slots(0, 2)  # waits 10 s for stable slots
    tick(10)  # Executing at 2; cooldown until 40, when its check is due
    slots(20, 4)  # during the cooldown: waits for that check
    tick(50)  # the check at 40 restarted the job: waiting 10 s, then 2 → 4 at 50; cooldown until 80
    slots(60, 3)  # lost a slot: Restarting → waiting 10 s
    tick(70)  # Executing at 3; cooldown until 100, but the job ends at 90
    clock.now = 90
    scheduler.finish()
    records += [decision_record(event) for event in scheduler.events]
    records.sort(key=lambda record: record["time"])

    (run,) = timeline(records)
    assert (run.start, run.end) == (0, 90)
    assert run.slots == [(0, 2), (20, 4), (60, 3)]
    assert run.parallelism == [(0, 0), (10, 2), (50, 4), (70, 3)]
    assert run.windows == [
        Window("waiting", 0, 10),
        Window("cooldown", 10, 40),
        Window("scheduled", 20, 40),  # the new slots wait for the cooldown's check
        Window("waiting", 40, 50),  # the rescale restarts the job (Flink 1.19/1.20)
        Window("cooldown", 50, 60),  # ended by the lost slot (Restarting)
        Window("waiting", 60, 70),
        Window("cooldown", 70, 90),
    ]


def test_several_runs_and_a_log_without_start() -> None:
    config = SchedulerConfig(max_parallelism=8)
    records = [start_record(0, config, "a"), resources_record(1, 2, ["0", "1"], []), start_record(100, config, "b")]
    first, second = timeline(records)
    assert (first.start, first.end, first.slots) == (0, 1, [(1, 2)])
    assert (second.start, second.end, second.slots) == (100, 100, [])
    with pytest.raises(ValueError, match="does not begin with a 'start' record"):
        timeline(records[1:])
