"""The adaptive scheduler's state machine on a fake clock: seed 002's test plan and more.

Expected parallelism over time is worked out by hand from the rules in the module doc.
"""

from __future__ import annotations

import pytest

from keyflow.config import ConfigError
from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig, State


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def running(slots: int = 2, **options: object) -> tuple[AdaptiveScheduler, FakeClock]:
    """A scheduler Executing at ``slots`` since t=10 (after the 10 s stabilization)."""
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=128, **options), clock)  # type: ignore[arg-type]
    scheduler.start()
    scheduler.on_resources(slots)
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    at(scheduler, clock, 10)
    assert (scheduler.state, scheduler.parallelism) == (State.EXECUTING, slots)
    return scheduler, clock


def at(scheduler: AdaptiveScheduler, clock: FakeClock, time: float, slots: int | None = None) -> int:
    clock.now = time
    if slots is None:
        scheduler.tick()
    else:
        scheduler.on_resources(slots)
    return scheduler.parallelism


def test_min_exceeded_rescales_at_once() -> None:
    scheduler, clock = running()
    assert at(scheduler, clock, 50, slots=4) == 4  # 40 s after the last rescale > 30 s
    assert scheduler.events[-1].reason == "new resources after cooldown"


def test_min_not_exceeded_schedules_the_rescale_after_the_cooldown() -> None:
    scheduler, clock = running()
    assert at(scheduler, clock, 20, slots=4) == 2  # 10 s into the cooldown: scheduled at 20 + 30
    assert at(scheduler, clock, 49.9) == 2
    assert at(scheduler, clock, 50) == 4


def test_slots_in_bursts_during_a_cooldown_give_one_rescale() -> None:
    scheduler, clock = running()
    for time, slots in ((20, 3), (30, 4), (45, 5)):
        assert at(scheduler, clock, time, slots) == 2
    assert at(scheduler, clock, 74.9) == 2  # each arrival restarted the cooldown: due at 45 + 30
    assert at(scheduler, clock, 75) == 5
    assert [(e.parallelism_from, e.parallelism_to) for e in scheduler.events if e.parallelism_from != e.parallelism_to][
        -1:
    ] == [(2, 5)]


def test_starvation_without_max() -> None:
    """Slots arriving every 20 s (< scaling-interval.min) push the rescale back forever."""
    scheduler, clock = running()
    for step in range(1, 15):
        assert at(scheduler, clock, 10 + 20 * step, slots=2 + step) == 2
    assert at(scheduler, clock, 10 + 20 * 14 + 29) == 2
    assert at(scheduler, clock, 10 + 20 * 14 + 30) == 16  # only once they stop


def test_starvation_is_bounded_by_max() -> None:
    """The same arrivals with scaling-interval.max = 60: the rescale is due at 10 + 60 at the latest."""
    scheduler, clock = running(scaling_interval_max=60.0)
    for time, slots in ((30, 3), (50, 4)):
        assert at(scheduler, clock, time, slots) == 2  # due 60, then pushed to min(80, 70)
    assert at(scheduler, clock, 69.9) == 2
    assert at(scheduler, clock, 70) == 4
    assert scheduler.events[-1].time == 70


def test_max_enabled_forces_a_small_increase_once_exceeded() -> None:
    scheduler, clock = running(min_parallelism_increase=3, scaling_interval_max=100.0)
    assert at(scheduler, clock, 50, slots=3) == 2  # +1 < 3 and 40 s < max: not rescaled
    assert "below min-parallelism-increase 3" in scheduler.events[-1].reason
    assert at(scheduler, clock, 109.9) == 2
    assert at(scheduler, clock, 110) == 3  # 100 s since the last rescale: forced
    assert scheduler.events[-1].reason.startswith("forced")


def test_max_disabled_never_forces() -> None:
    scheduler, clock = running(min_parallelism_increase=3)
    assert at(scheduler, clock, 50, slots=3) == 2
    assert at(scheduler, clock, 10_000) == 2


def test_increase_that_meets_the_minimum_is_not_forced() -> None:
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_max=100.0)
    assert at(scheduler, clock, 50, slots=4) == 4
    assert scheduler.events[-1].reason == "new resources after cooldown"


def test_resources_lost_during_a_cooldown_restart_and_wait_for_stability() -> None:
    scheduler, clock = running(slots=4)
    assert at(scheduler, clock, 20, slots=6) == 4  # scheduled at 50
    at(scheduler, clock, 25, slots=2)  # a worker lost
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    states = [e.state for e in scheduler.events[-2:]]
    assert states == [State.RESTARTING, State.WAITING_FOR_RESOURCES]
    assert at(scheduler, clock, 34.9) == 4  # not executing yet: stabilization runs to 35
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 35) == 2
    assert scheduler.state is State.EXECUTING
    assert at(scheduler, clock, 50) == 2  # the old scheduled rescale is gone


def test_slot_changes_while_waiting_restart_the_stabilization() -> None:
    scheduler, clock = running(slots=4)
    at(scheduler, clock, 20, slots=1)
    at(scheduler, clock, 25, slots=3)  # still changing
    assert at(scheduler, clock, 34) == 4
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 35) == 3


def test_a_failure_resets_the_cooldown() -> None:
    scheduler, clock = running()
    assert at(scheduler, clock, 50, slots=4) == 4  # rescaled at 50
    clock.now = 60
    scheduler.on_failure("task lost")
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 70) == 4  # back to Executing at 70: a new cooldown from 70
    assert at(scheduler, clock, 85, slots=6) == 4  # without the failure 85 - 50 > 30 would rescale now
    assert at(scheduler, clock, 115) == 6


def test_desired_parallelism_is_bounded() -> None:
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=8, upper_bound=3), clock)
    scheduler.start()
    scheduler.on_resources(10)
    assert (scheduler.state, scheduler.parallelism) == (State.EXECUTING, 3)  # all desired: no waiting
    assert scheduler.desired(100) == 3
    assert AdaptiveScheduler(SchedulerConfig(max_parallelism=2), clock).desired(100) == 2


def test_no_resources_within_the_wait_timeout_fails_the_job() -> None:
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=8, resource_wait_timeout=300), clock)
    scheduler.start()
    assert at(scheduler, clock, 299.9) == 0
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    at(scheduler, clock, 300)
    assert scheduler.state is State.FAILING
    at(scheduler, clock, 301)
    assert scheduler.state is State.FINISHED
    with pytest.raises(ValueError, match="has finished"):
        scheduler.cancel()


def test_every_decision_is_an_event() -> None:
    scheduler, clock = running()
    at(scheduler, clock, 50, slots=4)
    scheduler.cancel()
    assert [e.state for e in scheduler.events] == [
        State.WAITING_FOR_RESOURCES,
        State.EXECUTING,
        State.EXECUTING,
        State.CANCELING,
        State.FINISHED,
    ]
    rescale = scheduler.events[2]
    assert (rescale.time, rescale.available_slots, rescale.parallelism_from, rescale.parallelism_to) == (50, 4, 2, 4)


def test_config_defaults_aliases_and_errors() -> None:
    config = SchedulerConfig.from_options({}, max_parallelism=64)
    assert (config.scaling_interval_min, config.scaling_interval_max, config.min_parallelism_increase) == (30, None, 1)
    assert (config.resource_stabilization_timeout, config.resource_wait_timeout) == (10, 300)
    newer = SchedulerConfig.from_options(
        {
            "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": "1 min",
            "jobmanager.adaptive-scheduler.submission.resource-wait-timeout": "2 min",
            "jobmanager.adaptive-scheduler.submission.resource-stabilization-timeout": "500 ms",
            "jobmanager.adaptive-scheduler.executing.resource-stabilization-timeout": "5 min",  # = scaling-interval.max
        },
        max_parallelism=64,
    )
    assert (newer.scaling_interval_min, newer.resource_wait_timeout) == (60, 120)
    assert (newer.resource_stabilization_timeout, newer.scaling_interval_max) == (0.5, 300)
    key = "jobmanager.adaptive-scheduler.scaling-interval"
    with pytest.raises(ConfigError, match=r"scaling-interval.min='-5 s' must not be negative"):
        SchedulerConfig.from_options({f"{key}.min": "-5 s"}, max_parallelism=8)
    with pytest.raises(ConfigError, match=r"scaling-interval.max=30.0 s must be greater than scaling-interval.min"):
        SchedulerConfig.from_options({f"{key}.max": "30 s"}, max_parallelism=8)
    with pytest.raises(ConfigError, match=r"scaling-interval.min='soon' is not a duration"):
        SchedulerConfig.from_options({f"{key}.min": "soon"}, max_parallelism=8)
    with pytest.raises(ConfigError, match=r"min-parallelism-increase='two' is not an integer"):
        SchedulerConfig.from_options({"jobmanager.adaptive-scheduler.min-parallelism-increase": "two"}, 8)
    with pytest.raises(ConfigError, match=r"min-parallelism-increase=0 must be at least 1"):
        SchedulerConfig.from_options({"jobmanager.adaptive-scheduler.min-parallelism-increase": "0"}, 8)


def test_pipeline_configuration_feeds_the_scheduler() -> None:
    from keyflow.config import Config

    config = Config(
        {
            "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": "45 s",
            "jobmanager.adaptive-scheduler.min-parallelism-increase": "2",
        }
    )
    assert config["jobmanager.adaptive-scheduler.scaling-interval.min"] == "45 s"  # stored under the main name
    scheduler_config = SchedulerConfig.from_options(dict(config), max_parallelism=16)
    assert (scheduler_config.scaling_interval_min, scheduler_config.min_parallelism_increase) == (45, 2)
    with pytest.raises(ConfigError, match=r"resource-wait-timeout='-1 min' must not be negative"):
        Config({"jobmanager.adaptive-scheduler.submission.resource-wait-timeout": "-1 min"})
    both = {
        "jobmanager.adaptive-scheduler.scaling-interval.min": "10 s",
        "jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": "20 s",
    }
    with pytest.raises(ConfigError, match=r"scaling-interval.min and .*cooldown-after-rescaling are one option"):
        Config(both)


def test_inputs_the_state_machine_refuses() -> None:
    scheduler, _ = running()
    with pytest.raises(ValueError, match=r"start needs state Created, the scheduler is Executing"):
        scheduler.start()
    with pytest.raises(ValueError, match=r"available_slots=-1 must not be negative"):
        scheduler.on_resources(-1)


def test_the_scheduler_choice_is_validated() -> None:
    from keyflow.config import Config

    with pytest.raises(ConfigError, match=r"jobmanager.scheduler='auto' is invalid; choose one of default, adaptive"):
        Config({"jobmanager.scheduler": "auto"})


def test_timers_that_expired_act_before_a_new_input() -> None:
    scheduler, clock = running(2)  # Executing since 10: cooldown until 40
    assert at(scheduler, clock, 20, slots=4) == 2  # due at 50
    # No tick at 50: slots arriving at 50.2 must not push the overdue rescale back.
    assert at(scheduler, clock, 50.2, slots=5) == 4
    assert scheduler.events[-2].reason == "scheduled rescale after cooldown"
    assert scheduler.events[-1].due == pytest.approx(80.2)  # the 5th slot: in the new cooldown


def test_fewer_slots_during_a_scheduled_rescale_are_not_new_resources() -> None:
    scheduler, clock = running(2)
    at(scheduler, clock, 20, slots=5)  # due at 50
    assert at(scheduler, clock, 30, slots=4) == 2  # a decrease that stays above 2: due stays 50
    assert scheduler.events[-1].due == 50
    assert at(scheduler, clock, 50) == 4
    scheduler, clock = running(2)
    at(scheduler, clock, 20, slots=4)
    at(scheduler, clock, 30, slots=2)  # back to the parallelism before the due time
    assert at(scheduler, clock, 50) == 2
    assert scheduler.events[-1].reason == "the scheduled rescale is no longer needed: the slots went back"


def test_slots_that_never_settle_run_the_job_after_the_wait_timeout() -> None:
    clock = FakeClock()
    config = SchedulerConfig(max_parallelism=128, resource_stabilization_timeout=10, resource_wait_timeout=60)
    scheduler = AdaptiveScheduler(config, clock)
    scheduler.start()
    for second in range(0, 60, 5):  # a new slot count every 5 s: never stable for 10 s
        at(scheduler, clock, second, slots=1 + second % 2)
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 60) == 2
    assert scheduler.state is State.EXECUTING
    assert scheduler.events[-1].reason == "resources still changing after 60 s"


def test_bounds_that_are_not_positive_name_their_option() -> None:
    with pytest.raises(ConfigError, match=r"max parallelism 0 must be positive \(pipeline.max-parallelism\)"):
        SchedulerConfig(max_parallelism=0)
    with pytest.raises(ConfigError, match=r"parallelism.default=0 \(the upper bound\) must be positive"):
        SchedulerConfig(max_parallelism=8, upper_bound=0)
