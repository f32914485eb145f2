"""The adaptive scheduler's state machine on a fake clock.

Each case names the Flink test it mirrors (Flink 1.19/1.20: ``ExecutingTest``,
``WaitingForResourcesTest``, ``EnforceMinimalIncreaseRescalingControllerTest``) or the part
of seed 002's test plan it covers. Flink's tests call a state's handlers on a mock context;
here the same situations are set up with slots and times, and the expected parallelism
over time is worked out by hand from Flink's rules (see the module docstring).
"""

from __future__ import annotations

import pytest

from keyflow.config import RESOURCE_WAIT_TIMEOUT, Config
from keyflow.errors import ConfigError
from keyflow.scheduler.adaptive import AdaptiveScheduler, SchedulerConfig, State, should_rescale


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scheduler_with(**options: object) -> tuple[AdaptiveScheduler, FakeClock]:
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=128, **options), clock)  # type: ignore[arg-type]
    scheduler.start()
    return scheduler, clock


def running(slots: int = 2, **options: object) -> tuple[AdaptiveScheduler, FakeClock]:
    """A scheduler Executing at ``slots`` since t=10; its cooldown check is due at 10 +
    scaling-interval.min. Unless the test sets one, the stabilization timeout is 0, so a
    rescale (Restarting → WaitingForResources → Executing, as in Flink 1.19/1.20) completes
    at the instant it is decided."""
    scheduler, clock = scheduler_with(**{"resource_stabilization_timeout": 0.0, **options})
    at(scheduler, clock, 10 - scheduler.config.resource_stabilization_timeout, slots=slots)
    assert at(scheduler, clock, 10) == slots
    assert scheduler.state is State.EXECUTING
    return scheduler, clock


def at(scheduler: AdaptiveScheduler, clock: FakeClock, time: float, slots: int | None = None) -> int:
    clock.now = time
    if slots is None:
        scheduler.tick()
    else:
        scheduler.on_resources(slots)
    return scheduler.parallelism


def rescales(scheduler: AdaptiveScheduler) -> list[tuple[float, int, int]]:
    """Parallelism changes after the job first ran (each entering Executing at another parallelism)."""
    return [(e.time, e.parallelism_from, e.parallelism_to) for e in scheduler.events
            if e.state is State.EXECUTING and e.parallelism_from not in (0, e.parallelism_to)]  # fmt: skip


# -- Executing: ExecutingTest and seed 002's plan ---------------------------------------------


def test_notify_new_resources_available_before_cooldown_is_over_scheduled_state_change() -> None:
    """Seed 002, scaling-interval.min not exceeded: the rescale happens when the cooldown ends."""
    scheduler, clock = running()
    assert at(scheduler, clock, 20, slots=4) == 2  # 10 s into the 30 s cooldown
    assert scheduler.events[-1].due == 40  # the check scheduled on entering Executing at 10
    assert at(scheduler, clock, 39.9) == 2
    assert at(scheduler, clock, 40) == 4
    assert [e.state for e in scheduler.events[-3:]] == [State.RESTARTING, State.WAITING_FOR_RESOURCES, State.EXECUTING]
    assert scheduler.events[-3].reason == "rescale: 4 slots for parallelism 2"


def test_rescale_waits_for_resources_like_a_restart() -> None:
    """Flink 1.19/1.20 rescale by restarting: Restarting → WaitingForResources, whose
    stabilization applies (desired resources run at once); the cooldown counts from the new
    Executing. (Flink 2 skips WaitingForResources here, FLINK-36013; keyflow follows 1.19/1.20.)"""
    scheduler, clock = running(resource_stabilization_timeout=10.0)
    assert at(scheduler, clock, 50, slots=4) == 2  # checked at once: Restarting, then waiting until 60
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 55, slots=5) == 2  # the deadline (60) does not move
    assert at(scheduler, clock, 60) == 5  # one restart takes both
    assert at(scheduler, clock, 85, slots=6) == 5  # the cooldown runs from 60: checked at 90
    assert at(scheduler, clock, 90) == 5
    assert at(scheduler, clock, 100) == 6
    assert rescales(scheduler) == [(60, 2, 5), (100, 5, 6)]
    clock = FakeClock()
    bounded = AdaptiveScheduler(SchedulerConfig(max_parallelism=8, upper_bound=4), clock)
    bounded.start()
    assert at(bounded, clock, 0, slots=2) == 0
    assert at(bounded, clock, 10) == 2
    assert at(bounded, clock, 50, slots=4) == 4  # the upper bound: desired, no stabilization wait


def test_executing_checks_for_new_resources_when_being_created() -> None:
    """Slots that come at the very instant the job starts executing are checked by the
    check Executing schedules on entry (with scaling-interval.min = 0: at once)."""
    scheduler, clock = scheduler_with(scaling_interval_min=0.0, resource_stabilization_timeout=10.0)
    assert at(scheduler, clock, 0, slots=2) == 0  # sufficient: deadline 10
    assert at(scheduler, clock, 10, slots=4) == 2  # the deadline runs the job at 2 first (timers act first)
    assert [e.state for e in scheduler.events[-3:]] == [State.EXECUTING, State.RESTARTING, State.WAITING_FOR_RESOURCES]
    assert at(scheduler, clock, 20) == 4


def test_notify_new_resources_available_after_cooldown_is_over_state_change() -> None:
    """Seed 002, scaling-interval.min exceeded: the rescale happens at once."""
    scheduler, clock = running(scaling_interval_min=20.0)
    assert at(scheduler, clock, 40, slots=4) == 4  # 30 s after the last rescale > 20 s
    assert rescales(scheduler) == [(40, 2, 4)]


def test_notify_new_resources_available_with_can_scale_up_without_force_transitions_to_restarting() -> None:
    scheduler, clock = running(scaling_interval_min=0.0)
    assert at(scheduler, clock, 10.001, slots=3) == 3


def test_notify_new_resources_available_with_cant_scale_up_without_force_and_cant_scale_up_with_force() -> None:
    """Seed 002, scaling-interval.max enabled but the slots are gone when it is due: no rescale."""
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_min=0.0, scaling_interval_max=10.0)
    assert at(scheduler, clock, 11, slots=3) == 2  # +1 < 2, 1 s is not > 10 s: forced at 21, or at 20 by the
    assert scheduler.events[-1].due == 20  # force the entry check (at 10) scheduled: the earliest is logged
    assert at(scheduler, clock, 15, slots=2) == 2  # the slot leaves again (not below the parallelism)
    assert at(scheduler, clock, 30) == 2  # neither force (20: the entry check's, 21: this one's) finds a change
    assert scheduler.state is State.EXECUTING
    assert rescales(scheduler) == []


def test_notify_new_resources_available_with_cant_scale_up_without_force_and_can_scale_up_with_force_scheduled() -> (
    None
):
    """Seed 002, scaling-interval.max enabled and not exceeded: forced ``max`` after a check.

    As in Flink, every check that finds no rescale worth it schedules a force ``max`` later:
    here the cooldown's own check at 30 (nothing new then) schedules one at 60, the check of
    the new slot at 35 one at 65, and the first that finds the slot still there forces."""
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_min=20.0, scaling_interval_max=30.0)
    assert at(scheduler, clock, 35, slots=3) == 2  # 25 s since the last rescale: > 20, not > 30
    assert scheduler.events[-1].due == 60  # the cooldown check's force comes before this check's (65)
    assert at(scheduler, clock, 59.9) == 2
    assert at(scheduler, clock, 60) == 3
    assert scheduler.events[-3].reason.startswith("forced rescale")


def test_notify_new_resources_available_with_cant_scale_up_without_force_and_can_scale_up_with_force_immediate() -> (
    None
):
    """Seed 002, scaling-interval.max enabled and exceeded: forced at once."""
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_min=20.0, scaling_interval_max=30.0)
    assert at(scheduler, clock, 80, slots=3) == 3  # 70 s since the last rescale > 30 s
    assert scheduler.events[-3].reason.startswith("forced rescale")


def test_max_disabled_never_forces() -> None:
    """Seed 002, scaling-interval.max disabled: a small increase waits for more slots."""
    scheduler, clock = running(min_parallelism_increase=3)
    assert at(scheduler, clock, 50, slots=3) == 2
    assert "never forced" in scheduler.events[-1].reason
    assert at(scheduler, clock, 10_000) == 2
    assert at(scheduler, clock, 10_001, slots=5) == 5  # +3 meets the minimum


def test_slots_arriving_during_a_cooldown_do_not_move_the_check() -> None:
    """Flink's "only one schedule at a time": bursts cost one rescale, at the end of the cooldown."""
    scheduler, clock = running()
    for time, slots in ((20, 3), (30, 4), (39, 5)):
        assert at(scheduler, clock, time, slots) == 2
        assert scheduler.events[-1].due == 40
    assert at(scheduler, clock, 40) == 5
    assert rescales(scheduler) == [(40, 2, 5)]


def test_slots_arriving_more_often_than_the_cooldown_do_not_starve_the_job() -> None:
    """Without scaling-interval.max, a slot every 20 s (< 30 s) still rescales at every cooldown's end."""
    scheduler, clock = running()
    for step in range(1, 8):
        at(scheduler, clock, 10 + 20 * step, slots=2 + step)
    assert [time for time, _, _ in rescales(scheduler)] == [40, 70, 100, 130]
    assert scheduler.parallelism == 7  # the 8th slot came at 130, just after that instant's check
    assert at(scheduler, clock, 160) == 9


def test_bounds_are_strict() -> None:
    """ "More than" scaling-interval.min/max, as in Flink: exactly min after the last rescale
    is still in the cooldown, exactly max still waits for the scheduled force."""
    scheduler, clock = running()
    assert at(scheduler, clock, 40, slots=3) == 2  # the check at 40 ran first; since = 30 is not > 30
    assert scheduler.events[-1].due == 70
    assert at(scheduler, clock, 70) == 3
    scheduler, clock = running()
    at(scheduler, clock, 40)
    assert at(scheduler, clock, 40.001, slots=3) == 3  # just beyond: at once
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_min=20.0, scaling_interval_max=30.0)
    assert at(scheduler, clock, 40, slots=3) == 2  # since = 30 is not > 30: not forced at once
    assert scheduler.events[-1].due == 60  # but by the force the cooldown check at 30 scheduled
    scheduler, clock = running(min_parallelism_increase=2, scaling_interval_min=20.0, scaling_interval_max=30.0)
    assert at(scheduler, clock, 40.001, slots=3) == 3


def test_timer_due_at_the_instant_of_new_slots_acts_first() -> None:
    """Flink's order: advancing the clock runs due tasks before the next notification."""
    scheduler, clock = running()
    at(scheduler, clock, 20, slots=4)  # check due at 40
    assert at(scheduler, clock, 40, slots=5) == 4  # the check rescales to 4 first; the 5th slot is new to it
    assert scheduler.events[-1].due == 70  # and waits for the new Executing's cooldown
    assert at(scheduler, clock, 70) == 5
    scheduler, clock = running()
    at(scheduler, clock, 20, slots=4)
    assert at(scheduler, clock, 55, slots=5) == 4  # no tick at 40: the overdue check still acts before 55's slots
    assert rescales(scheduler)[-1][2] == 4


def test_scale_up() -> None:
    """EnforceMinimalIncreaseRescalingControllerTest.testScaleUp (minimum increase 2)."""
    assert should_rescale(1, 4, min_increase=2, forced=False)


def test_no_scale_up() -> None:
    """EnforceMinimalIncreaseRescalingControllerTest.testNoScaleUp."""
    assert not should_rescale(2, 3, min_increase=2, forced=False)


def test_always_scale_down() -> None:
    """EnforceMinimalIncreaseRescalingControllerTest.testAlwaysScaleDown; and the forced
    controller (EnforceParallelismChangeRescalingController): any change, never none."""
    assert should_rescale(3, 1, min_increase=2, forced=False)
    assert should_rescale(2, 3, min_increase=2, forced=True)
    assert not should_rescale(2, 2, min_increase=1, forced=True)


def test_lost_slots_restart_the_job() -> None:
    """In Executing a decrease never reaches the controllers: lost slots restart the job, as
    Flink's failing tasks do, and WaitingForResources decides the new parallelism."""
    scheduler, clock = running(slots=4, min_parallelism_increase=3, resource_stabilization_timeout=10.0)
    at(scheduler, clock, 20, slots=2)
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert [e.state for e in scheduler.events[-2:]] == [State.RESTARTING, State.WAITING_FOR_RESOURCES]
    assert at(scheduler, clock, 30) == 2


def test_resources_lost_during_a_cooldown_restart_and_wait_for_stability() -> None:
    scheduler, clock = running(slots=4, resource_stabilization_timeout=10.0)
    assert at(scheduler, clock, 20, slots=6) == 4  # check due at 40
    at(scheduler, clock, 25, slots=2)  # a worker lost
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 34.9) == 4  # not executing yet: stabilization deadline 35
    assert at(scheduler, clock, 35) == 2
    assert scheduler.state is State.EXECUTING
    assert at(scheduler, clock, 40) == 2  # the old Executing's check is gone


def test_a_failure_resets_the_cooldown() -> None:
    scheduler, clock = running(resource_stabilization_timeout=10.0)
    assert at(scheduler, clock, 50, slots=4) == 2  # checked at once: restarting, stabilization until 60
    assert at(scheduler, clock, 60) == 4
    clock.now = 60
    scheduler.on_failure("task lost")
    assert scheduler.state is State.WAITING_FOR_RESOURCES
    assert at(scheduler, clock, 70) == 4  # back to Executing at 70: a new cooldown from 70
    assert at(scheduler, clock, 85, slots=6) == 4  # without the failure 85 - 50 > 30 would rescale now
    assert at(scheduler, clock, 100) == 4  # the check at 100 restarts; stabilization until 110
    assert at(scheduler, clock, 110) == 6


# -- WaitingForResources: WaitingForResourcesTest --------------------------------------------


def test_transition_to_creating_execution_graph() -> None:
    """Desired resources (the upper bound) run the job at once, whatever the stabilization."""
    clock = FakeClock()
    config = SchedulerConfig(max_parallelism=8, upper_bound=3, resource_stabilization_timeout=600)
    scheduler = AdaptiveScheduler(config, clock)
    scheduler.start()
    scheduler.on_resources(10)
    assert (scheduler.state, scheduler.parallelism) == (State.EXECUTING, 3)
    assert scheduler.events[-1].reason == "all desired resources available"


def test_not_enough_resources() -> None:
    scheduler, clock = scheduler_with()
    assert at(scheduler, clock, 200, slots=0) == 0
    assert scheduler.state is State.WAITING_FOR_RESOURCES


def test_notify_new_resources_available() -> None:
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=8, upper_bound=2), clock)
    scheduler.start()
    assert at(scheduler, clock, 1, slots=1) == 0  # sufficient, not desired: the deadline is 11
    assert at(scheduler, clock, 2, slots=2) == 2  # desired: at once


def test_scheduling_with_sufficient_resources_and_no_stabilization_timeout() -> None:
    scheduler, clock = scheduler_with(resource_stabilization_timeout=0.0)
    assert at(scheduler, clock, 5, slots=1) == 1


def test_no_scheduling_if_stabilization_timeout_is_configured() -> None:
    scheduler, clock = scheduler_with(resource_stabilization_timeout=50.0)
    assert at(scheduler, clock, 0, slots=1) == 0
    assert at(scheduler, clock, 49.9) == 0
    assert scheduler.state is State.WAITING_FOR_RESOURCES


def test_scheduling_with_sufficient_resources_after_stabilization_timeout() -> None:
    scheduler, clock = scheduler_with(resource_wait_timeout=-1.0, resource_stabilization_timeout=50.0)
    at(scheduler, clock, 0, slots=1)
    assert at(scheduler, clock, 50.001) == 1


def test_stabilization_timeout_reset() -> None:
    """Sufficient at 40 ms, insufficient at 80 (the deadline is cleared), sufficient at 120:
    the job runs at 170, not at 90 and not at 121."""
    scheduler, clock = scheduler_with(resource_wait_timeout=-1.0, resource_stabilization_timeout=0.050)
    at(scheduler, clock, 0.040, slots=1)
    at(scheduler, clock, 0.080, slots=0)
    at(scheduler, clock, 0.120, slots=1)
    assert at(scheduler, clock, 0.121) == 0
    assert at(scheduler, clock, 0.1699) == 0
    assert at(scheduler, clock, 0.170) == 1


def test_changes_while_sufficient_do_not_extend_the_deadline() -> None:
    """Issue 11: the deadline is set once when resources become sufficient; a trickle of
    changes does not delay the job (it runs at what is there at the deadline)."""
    scheduler, clock = running(slots=4, resource_stabilization_timeout=10.0)
    at(scheduler, clock, 20, slots=1)  # lost slots: waiting, sufficient now, deadline 30
    for time, slots in ((23, 2), (26, 3), (29, 2)):
        assert at(scheduler, clock, time, slots) == 4
    assert at(scheduler, clock, 30) == 2
    assert scheduler.events[-1].reason == "sufficient resources for 10 s (resource-stabilization-timeout)"


def test_no_state_transition_on_no_resource_timeout() -> None:
    """A negative resource-wait-timeout waits forever (Flink's -1)."""
    scheduler, clock = scheduler_with(resource_wait_timeout=-1.0)
    assert at(scheduler, clock, 1e9) == 0
    assert scheduler.state is State.WAITING_FOR_RESOURCES


def test_state_transition_on_resource_timeout() -> None:
    """At resource-wait-timeout the job runs at what is there; with no slot it fails (Flink
    goes on to create the execution graph, which fails for lack of slots)."""
    scheduler, clock = scheduler_with(resource_wait_timeout=300.0)
    assert at(scheduler, clock, 299.9) == 0
    at(scheduler, clock, 300)
    assert scheduler.state is State.FINISHED
    assert scheduler.events[-1].reason == "job failed: no slot when resource-wait-timeout (300 s) ran out"
    with pytest.raises(ValueError, match="has finished"):
        scheduler.cancel()
    scheduler, clock = scheduler_with(resource_wait_timeout=60.0, resource_stabilization_timeout=600.0)
    at(scheduler, clock, 5, slots=1)
    assert at(scheduler, clock, 60) == 1
    assert scheduler.events[-1].reason == "resource-wait-timeout of 60 s passed: running with the slots there"


# -- the rest of the contract ----------------------------------------------------------------


def test_desired_parallelism_is_bounded() -> None:
    clock = FakeClock()
    scheduler = AdaptiveScheduler(SchedulerConfig(max_parallelism=8, upper_bound=3), clock)
    assert scheduler.desired(100) == 3
    assert AdaptiveScheduler(SchedulerConfig(max_parallelism=2), clock).desired(100) == 2


def test_every_decision_is_an_event() -> None:
    scheduler, clock = running()
    at(scheduler, clock, 50, slots=4)
    scheduler.cancel()
    assert [e.state for e in scheduler.events] == [
        State.WAITING_FOR_RESOURCES,
        State.EXECUTING,
        State.RESTARTING,
        State.WAITING_FOR_RESOURCES,
        State.EXECUTING,
        State.CANCELING,
        State.FINISHED,
    ]
    rescale = scheduler.events[4]
    assert (rescale.time, rescale.available_slots, rescale.parallelism_from, rescale.parallelism_to) == (50, 4, 2, 4)


def test_config_defaults_aliases_and_errors() -> None:
    config = SchedulerConfig.from_config(Config(), max_parallelism=64)
    assert (config.scaling_interval_min, config.scaling_interval_max, config.min_parallelism_increase) == (30, None, 1)
    assert (config.resource_stabilization_timeout, config.resource_wait_timeout, config.upper_bound) == (10, 300, None)
    newer = SchedulerConfig.from_config(
        Config(
            {
                "jobmanager.adaptive-scheduler.submission.resource-wait-timeout": "-1 s",
                "jobmanager.adaptive-scheduler.submission.resource-stabilization-timeout": "500 ms",
                "parallelism.default": "4",
            }
        ),
        max_parallelism=64,
    )
    assert (newer.resource_wait_timeout, newer.resource_stabilization_timeout, newer.upper_bound) == (-1, 0.5, 4)
    key = "jobmanager.adaptive-scheduler.scaling-interval"
    with pytest.raises(ConfigError, match=r"scaling-interval.min='-5 s' must not be negative"):
        Config({f"{key}.min": "-5 s"})
    with pytest.raises(ConfigError, match=r"scaling-interval.max=30.0 s must be greater than scaling-interval.min"):
        SchedulerConfig.from_config(Config({f"{key}.max": "30 s"}), max_parallelism=8)
    with pytest.raises(ConfigError, match=r"scaling-interval.min='soon' is not a duration"):
        Config({f"{key}.min": "soon"})
    with pytest.raises(ConfigError, match=r"min-parallelism-increase='two' is invalid; it must be a positive integer"):
        Config({"jobmanager.adaptive-scheduler.min-parallelism-increase": "two"})
    with pytest.raises(ConfigError, match=r"unknown configuration key .*scaling-interval.mn'; did you mean .*min\?"):
        Config({f"{key}.mn": "5 s"})


@pytest.mark.parametrize(
    ("name", "meaning", "fix"),
    [
        ("executing.cooldown-after-rescaling", "another state machine", "use jobmanager.adaptive-scheduler.scaling"),
        ("executing.resource-stabilization-timeout", "default 60 s", "scaling-interval.max: use those"),
        ("rescale-trigger.max-delay", "FLIP-461", "remove it"),
        ("rescale-trigger.max-checkpoint-failures", "FLIP-461", "remove it"),
        ("max-delay-for-scale-trigger", "FLIP-461", "remove it"),
        ("scale-on-failed-checkpoints-count", "FLIP-461", "remove it"),
    ],
)
def test_flink_2_names_with_another_meaning_are_refused(name: str, meaning: str, fix: str) -> None:
    """Flink 2 drives these from another state machine: accepting them here would give them a
    meaning Flink does not; the error says what they mean there and what to use here."""
    key = f"jobmanager.adaptive-scheduler.{name}"
    with pytest.raises(ConfigError, match=rf"{key} is not supported: in Flink 2 .*{meaning}.*{fix}"):
        Config({key: "1 s"})


def test_pipeline_configuration_feeds_the_scheduler() -> None:
    config = Config(
        {
            "jobmanager.adaptive-scheduler.submission.resource-wait-timeout": "-1 min",
            "jobmanager.adaptive-scheduler.min-parallelism-increase": "2",
        }
    )
    assert config.get(RESOURCE_WAIT_TIMEOUT) == -60  # stored under the main name
    scheduler_config = SchedulerConfig.from_config(config, max_parallelism=16)
    assert (scheduler_config.resource_wait_timeout, scheduler_config.min_parallelism_increase) == (-60, 2)
    with pytest.raises(ConfigError, match=r"resource-stabilization-timeout='-1 min' must not be negative"):
        Config({"jobmanager.adaptive-scheduler.submission.resource-stabilization-timeout": "-1 min"})
    both = {
        "jobmanager.adaptive-scheduler.resource-wait-timeout": "10 s",
        "jobmanager.adaptive-scheduler.submission.resource-wait-timeout": "20 s",
    }
    with pytest.raises(ConfigError, match=r"resource-wait-timeout and .*submission.resource-wait-timeout are one"):
        Config(both)


def test_inputs_the_state_machine_refuses() -> None:
    scheduler, _ = running()
    with pytest.raises(ValueError, match=r"start needs state Created, the scheduler is Executing"):
        scheduler.start()
    with pytest.raises(ValueError, match=r"available_slots=-1 must not be negative"):
        scheduler.on_resources(-1)


def test_the_scheduler_choice_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"jobmanager.scheduler='auto' is invalid; choose one of default, adaptive"):
        Config({"jobmanager.scheduler": "auto"})


def test_bounds_that_are_not_positive_name_their_option() -> None:
    with pytest.raises(ConfigError, match=r"max parallelism 0 must be positive \(pipeline.max-parallelism\)"):
        SchedulerConfig(max_parallelism=0)
    with pytest.raises(ConfigError, match=r"parallelism.default=0 \(the upper bound\) must be positive"):
        SchedulerConfig(max_parallelism=8, upper_bound=0)
