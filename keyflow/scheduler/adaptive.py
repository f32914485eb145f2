"""The adaptive scheduler with a rescale cooldown: Flink 1.19/1.20's AdaptiveScheduler
(FLIP-160 states, FLIP-322 cooldown), rule for rule, on an injectable clock.

Executing (Flink's ``Executing``): entering it (at start or after a rescale) starts the
cooldown and schedules one rescale check ``scaling-interval.min`` later. New slots more
than ``scaling-interval.min`` after the last rescale are checked at once; earlier ones are
left to the check already scheduled ("only one schedule at a time": later arrivals do not
move it), so slots arriving during a cooldown cost one rescale and never starve the job. A
check rescales if the change is a decrease or an increase of at least
``min-parallelism-increase``; otherwise, with ``scaling-interval.max`` set, the increase is
forced at once if the last rescale is more than ``scaling-interval.max`` ago, else by a
forced-rescale check ``scaling-interval.max`` after it (every check that rescales nothing
schedules one; the first that finds the slots still there forces). Both bounds are strict
("more than"), as in Flink. A rescale restarts the job, as in Flink 1.19/1.20: Restarting →
WaitingForResources (whose rules decide the new parallelism) → a new Executing, whose
cooldown counts from then. (Flink 2 skips WaitingForResources there, FLINK-36013.)

WaitingForResources (Flink's ``WaitingForResources``): all desired slots (the upper bound)
run the job at once. Sufficient slots (at least one) set a stabilization deadline
``resource-stabilization-timeout`` ahead, once: later changes do not move it. Only new slots
are events here (Flink notifies states of new slots only); a check, on new slots or at the
deadline, that finds no slot clears the deadline. At the deadline the job runs at what is
there. ``resource-wait-timeout`` after entering the state the job runs at what is there,
or fails with no slot; a negative timeout waits forever. Lost slots and failures go
Executing → Restarting → WaitingForResources: the cooldown belongs to Executing.

Timers run as Flink's ``runIfState``: earliest due first, at their due time. Those due at or
before the instant of a new input act before it: keyflow's choice for the same instant
(Flink's main thread takes whichever comes first), consistent with
``WaitingForResourcesTest``, whose clock runs the due tasks before the next notification.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from keyflow.config import (
    DEFAULT_PARALLELISM,
    MIN_PARALLELISM_INCREASE,
    RESOURCE_STABILIZATION_TIMEOUT,
    RESOURCE_WAIT_TIMEOUT,
    SCALING_INTERVAL_MAX,
    SCALING_INTERVAL_MIN,
    Config,
)
from keyflow.errors import ConfigError

Clock = Callable[[], float]

PREFIX = "jobmanager.adaptive-scheduler."


class State(StrEnum):
    CREATED = "Created"
    WAITING_FOR_RESOURCES = "WaitingForResources"
    EXECUTING = "Executing"
    RESTARTING = "Restarting"
    FINISHED = "Finished"
    FAILING = "Failing"
    CANCELING = "Canceling"


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's options in seconds; ``upper_bound`` caps the parallelism (None: K)."""

    max_parallelism: int
    scaling_interval_min: float = 30.0
    scaling_interval_max: float | None = None
    min_parallelism_increase: int = 1
    resource_stabilization_timeout: float = 10.0
    resource_wait_timeout: float = 300.0  # negative: wait forever
    upper_bound: int | None = None

    def __post_init__(self) -> None:
        if self.scaling_interval_min < 0:
            raise ConfigError(f"{PREFIX}scaling-interval.min={self.scaling_interval_min} s must not be negative")
        if self.scaling_interval_max is not None and self.scaling_interval_max <= self.scaling_interval_min:
            raise ConfigError(
                f"{PREFIX}scaling-interval.max={self.scaling_interval_max} s must be greater than "
                f"scaling-interval.min={self.scaling_interval_min} s; raise it or leave it unset (no forced rescale)"
            )
        if self.min_parallelism_increase < 1:
            raise ConfigError(f"{PREFIX}min-parallelism-increase={self.min_parallelism_increase} must be at least 1")
        if self.resource_stabilization_timeout < 0:
            raise ConfigError(
                f"{PREFIX}resource-stabilization-timeout={self.resource_stabilization_timeout} s must not be negative"
            )
        if self.max_parallelism < 1:
            raise ConfigError(f"max parallelism {self.max_parallelism} must be positive (pipeline.max-parallelism)")
        if self.upper_bound is not None and self.upper_bound < 1:
            raise ConfigError(f"parallelism.default={self.upper_bound} (the upper bound) must be positive")

    @staticmethod
    def from_config(config: Config, max_parallelism: int) -> SchedulerConfig:
        """From the pipeline's ``jobmanager.adaptive-scheduler.*`` options (parsed and aliased
        there); ``parallelism.default``, if set, is the upper bound."""
        return SchedulerConfig(
            max_parallelism=max_parallelism,
            scaling_interval_min=config.get(SCALING_INTERVAL_MIN),
            scaling_interval_max=config.get(SCALING_INTERVAL_MAX),
            min_parallelism_increase=config.get(MIN_PARALLELISM_INCREASE),
            resource_stabilization_timeout=config.get(RESOURCE_STABILIZATION_TIMEOUT),
            resource_wait_timeout=config.get(RESOURCE_WAIT_TIMEOUT),
            upper_bound=config.get(DEFAULT_PARALLELISM),
        )


def should_rescale(current: int, target: int, min_increase: int, forced: bool) -> bool:
    """Flink's rescaling controllers: ``EnforceParallelismChangeRescalingController`` (forced:
    any change) and ``EnforceMinimalIncreaseRescalingController`` (a decrease, or an increase
    of at least ``min-parallelism-increase``). In Executing a decrease never gets here: lost
    slots restart the job first, as Flink's failing tasks do."""
    change = target - current
    if forced:
        return change != 0
    return change < 0 or change >= min_increase


@dataclass(frozen=True)
class Decision:
    """One event of the scheduler's timeline."""

    time: float
    state: State
    available_slots: int
    parallelism_from: int
    parallelism_to: int
    reason: str
    due: float | None = None  # a scheduled rescale: when it is due


@dataclass
class AdaptiveScheduler:
    """The state machine. Call ``start()``, then feed it ``on_resources``/``on_failure``/``tick``."""

    config: SchedulerConfig
    clock: Clock
    state: State = State.CREATED
    parallelism: int = 0
    available: int = 0
    events: list[Decision] = field(default_factory=list)
    _entered: float = 0.0  # when the current state began
    _last_rescale: float = 0.0  # Executing: when it began (Flink's lastRescale); the cooldown counts from it
    _check_due: float | None = None  # Executing: the scheduled rescale check (Flink's rescaleScheduled)
    _force_due: list[float] = field(default_factory=list)  # Executing: forced rescales awaiting their time
    _deadline: float | None = None  # WaitingForResources: the resource stabilization deadline

    def desired(self, available: int | None = None) -> int:
        """min(available slots, configured upper bound, max parallelism)."""
        slots = self.available if available is None else available
        return max(0, min(slots, self.ceiling))

    @property
    def ceiling(self) -> int:
        """The most the job can use: min(configured upper bound, max parallelism)."""
        return min(self.config.upper_bound or self.config.max_parallelism, self.config.max_parallelism)

    # -- inputs ----------------------------------------------------------------------------
    def start(self) -> None:
        self._require(State.CREATED, "start")
        self._enter_waiting(self.clock(), "job submitted")

    def on_resources(self, available_slots: int) -> None:
        """The slots available now (Spark: executor cores); call on every change or periodically.

        Timers due at or before now act first, as in Flink's tests, where advancing the clock
        runs the due tasks before the next notification is delivered."""
        if available_slots < 0:
            raise ValueError(f"available_slots={available_slots} must not be negative")
        now = self.clock()
        self._run_timers(now)
        previous, self.available = self.available, available_slots
        if self.state is State.WAITING_FOR_RESOURCES:
            if available_slots > previous:  # Flink notifies states of new slots only
                self._check_resources(now)
        elif self.state is State.EXECUTING:
            if self.desired() < self.parallelism:  # Flink: the lost slots' tasks fail
                self._restart(now, f"resources lost: {self._slots()} for parallelism {self.parallelism}")
            elif available_slots > previous:
                self._rescale_when_cooldown_is_over(now)
        self._run_timers(now)

    def on_failure(self, error: object) -> None:
        """A failure of the running job: the cooldown ends; wait for resources again."""
        now = self.clock()
        self._run_timers(now)
        if self.state is State.EXECUTING:
            self._restart(now, f"failure: {error}")

    def tick(self) -> None:
        """Advance timers to the clock's now."""
        self._run_timers(self.clock())

    def finish(self) -> None:
        self._move(self.clock(), State.FINISHED, self.parallelism, "job finished")

    def cancel(self) -> None:
        now = self.clock()
        self._move(now, State.CANCELING, self.parallelism, "cancel requested")
        self._move(now, State.FINISHED, self.parallelism, "job canceled")

    def fail(self, error: object) -> None:
        """A failure the job does not recover from (it stops): Failing, then Finished."""
        now = self.clock()
        self._move(now, State.FAILING, self.parallelism, f"failure: {error}")
        self._move(now, State.FINISHED, self.parallelism, "job failed")

    # -- timers: Flink's runIfState; the earliest due first -----------------------------------
    def _run_timers(self, now: float) -> None:
        while (timer := self._next_timer()) is not None and timer[0] <= now:
            due, action = timer
            action(due)  # at its due time, as Flink's timer would have run

    def _next_timer(self) -> tuple[float, Callable[[float], None]] | None:
        timers: list[tuple[float, Callable[[float], None]]] = []
        if self.state is State.WAITING_FOR_RESOURCES:
            if self._deadline is not None:
                timers.append((self._deadline, self._check_resources))
            timeout = self.config.resource_wait_timeout
            if timeout >= 0:  # negative: wait for resources forever (as in Flink)
                timers.append((self._entered + timeout, self._resource_timeout))
        elif self.state is State.EXECUTING:
            if self._check_due is not None:
                timers.append((self._check_due, self._maybe_rescale))
            if self._force_due:
                timers.append((self._force_due[0], self._forced_timer))
        return min(timers, key=lambda timer: timer[0], default=None)

    # -- WaitingForResources (Flink's WaitingForResources) -----------------------------------
    def _enter_waiting(self, now: float, reason: str) -> None:
        self._move(now, State.WAITING_FOR_RESOURCES, self.parallelism, reason)
        self._entered, self._deadline = now, None
        self._check_resources(now)

    def _check_resources(self, now: float) -> None:
        """Desired resources run the job at once; sufficient ones once they have been so since
        a deadline set when they first became sufficient (not moved by later changes)."""
        target = self.desired()
        if target >= 1 and target == self.ceiling:
            self._execute(now, target, "all desired resources available")
        elif target >= 1:
            if self._deadline is None:
                self._deadline = now + self.config.resource_stabilization_timeout
            if now >= self._deadline:
                timeout = self.config.resource_stabilization_timeout
                self._execute(now, target, f"sufficient resources for {timeout:g} s (resource-stabilization-timeout)")
        else:
            self._deadline = None  # insufficient: the deadline starts again when they are sufficient

    def _resource_timeout(self, now: float) -> None:
        timeout, target = self.config.resource_wait_timeout, self.desired()
        if target >= 1:
            self._execute(now, target, f"resource-wait-timeout of {timeout:g} s passed: running with the slots there")
        else:  # Flink: creating the execution graph fails for lack of slots, the job is FAILED
            self._move(
                now, State.FINISHED, 0, f"job failed: no slot when resource-wait-timeout ({timeout:g} s) ran out"
            )

    # -- Executing (Flink 1.19/1.20's Executing) ---------------------------------------------
    def _execute(self, now: float, parallelism: int, reason: str) -> None:
        self._move(now, State.EXECUTING, parallelism, reason)
        self._enter_executing(now)

    def _enter_executing(self, now: float) -> None:
        """A new Executing state (after waiting, or after a rescale): the cooldown starts now,
        and a rescale check is scheduled at its end (new slots may come in the meantime)."""
        self._last_rescale, self._check_due, self._force_due = now, None, []
        self._rescale_when_cooldown_is_over(now)

    def _rescale_when_cooldown_is_over(self, now: float) -> None:
        """More than ``scaling-interval.min`` since the last rescale: check now. Otherwise one
        check is scheduled ``scaling-interval.min`` later, if none is yet; later arrivals do not
        move it."""
        if now - self._last_rescale > self.config.scaling_interval_min:
            self._maybe_rescale(now)
            return
        if self._check_due is None:
            self._check_due = now + self.config.scaling_interval_min
        if self.desired() != self.parallelism:
            self._record(now, "new resources during cooldown: rescale check when it ends", self._check_due)

    def _maybe_rescale(self, now: float) -> None:
        self._check_due = None
        target, maximum = self.desired(), self.config.scaling_interval_max
        if should_rescale(self.parallelism, target, self.config.min_parallelism_increase, forced=False):
            self._restart(now, f"rescale: {self._slots()} for parallelism {self.parallelism}")
        elif maximum is not None:
            if now - self._last_rescale > maximum:
                self._force_rescale(now)
            else:
                self._force_due.append(now + maximum)
                if target != self.parallelism:
                    self._record(
                        now,
                        f"increase {target - self.parallelism} is below min-parallelism-increase "
                        f"{self.config.min_parallelism_increase}: forced at the next forced-rescale check",
                        self._force_due[0],  # an earlier check's force may come first
                    )
        elif target != self.parallelism:
            self._record(
                now,
                f"increase {target - self.parallelism} is below min-parallelism-increase "
                f"{self.config.min_parallelism_increase} (no scaling-interval.max: never forced)",
            )

    def _forced_timer(self, now: float) -> None:
        self._force_due.pop(0)
        self._force_rescale(now)

    def _force_rescale(self, now: float) -> None:
        target = self.desired()
        if should_rescale(self.parallelism, target, self.config.min_parallelism_increase, forced=True):
            since = now - self._last_rescale
            self._restart(
                now, f"forced rescale: {self._slots()}, {since:g} s since the last rescale (scaling-interval.max)"
            )

    def _slots(self) -> str:
        return f"{self.available} slot{'s' if self.available != 1 else ''}"

    def _restart(self, now: float, reason: str) -> None:
        self._move(now, State.RESTARTING, self.parallelism, reason)
        self._enter_waiting(now, "restarted")

    # -- records -----------------------------------------------------------------------------
    def _move(self, now: float, state: State, parallelism: int, reason: str) -> None:
        if self.state is State.FINISHED:
            raise ValueError(f"the job has finished; it cannot go to {state}")
        before, self.state, self.parallelism = self.parallelism, state, parallelism
        self.events.append(Decision(now, state, self.available, before, parallelism, reason))

    def _record(self, now: float, reason: str, due: float | None = None) -> None:
        """A decision that keeps the state and parallelism."""
        p = self.parallelism
        self.events.append(Decision(now, self.state, self.available, p, p, reason, due))

    def _require(self, state: State, action: str) -> None:
        if self.state is not state:
            raise ValueError(f"{action} needs state {state}, the scheduler is {self.state}")
