"""The adaptive scheduler with a rescale cooldown (Flink's FLIP-160 states, FLIP-322 cooldown).

A streaming job follows the slots (Spark executor cores) it has. New slots while
Executing trigger a rescale at once if the last rescale is more than
``scaling-interval.min`` ago and none is scheduled; otherwise the rescale is scheduled at
now + ``scaling-interval.min`` — new slots during a cooldown restart it, so bursts of
arriving slots cause one rescale, not many. When the rescale is due it happens if the increase is
at least ``min-parallelism-increase``; a smaller increase is forced once
``scaling-interval.max`` (if set) has passed since the last rescale.

Starvation: slots that keep arriving more often than ``scaling-interval.min`` keep
pushing the scheduled rescale back. With ``scaling-interval.max`` set, a due time is never
later than the last rescale + ``scaling-interval.max``, which bounds the wait; without it
the job stays at its parallelism until slots stop arriving for ``scaling-interval.min``.

Lost slots: Executing → Restarting → WaitingForResources, which runs at the new
parallelism once the slots have been stable for ``resource-stabilization-timeout``. The
cooldown belongs to the Executing state: a failure or a loss of slots ends it.

Everything is driven by calls (``on_resources``, ``on_failure``, ``tick``) and an
injectable clock, so every decision is testable without waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from keyflow.config import ALIASES, ConfigError, parse_duration

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
    resource_wait_timeout: float = 300.0
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
        for name in ("resource_stabilization_timeout", "resource_wait_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.replace('_', '-')}={getattr(self, name)} s must not be negative")
        if self.max_parallelism < 1:
            raise ConfigError(f"max parallelism {self.max_parallelism} must be positive (pipeline.max-parallelism)")
        if self.upper_bound is not None and self.upper_bound < 1:
            raise ConfigError(f"parallelism.default={self.upper_bound} (the upper bound) must be positive")

    @staticmethod
    def from_options(
        options: Mapping[str, Any], max_parallelism: int, upper_bound: int | None = None
    ) -> SchedulerConfig:
        """From ``jobmanager.adaptive-scheduler.*`` keys (Flink's older and newer names)."""
        values: dict[str, Any] = {}
        for key, value in options.items():
            canonical = ALIASES.get(key, key)
            if canonical.startswith(PREFIX) and value is not None:
                values[canonical.removeprefix(PREFIX)] = (key, value)

        def duration(name: str, default: float) -> float:
            return parse_duration(*values[name]) if name in values else default

        key, increase = values.get("min-parallelism-increase", ("", 1))
        try:
            minimum_increase = int(str(increase).strip())
        except ValueError:
            raise ConfigError(f"{key}={increase!r} is not an integer") from None
        return SchedulerConfig(
            max_parallelism=max_parallelism,
            scaling_interval_min=duration("scaling-interval.min", 30.0),
            scaling_interval_max=parse_duration(*values["scaling-interval.max"])
            if "scaling-interval.max" in values
            else None,
            min_parallelism_increase=minimum_increase,
            resource_stabilization_timeout=duration("resource-stabilization-timeout", 10.0),
            resource_wait_timeout=duration("resource-wait-timeout", 300.0),
            upper_bound=upper_bound,
        )


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
    _since: float = 0.0  # when the current state (or, while waiting, the last slot change) began
    _entered_waiting: float = 0.0
    _last_rescale: float = 0.0  # start of the cooldown: entering Executing or the last rescale
    _due: float | None = None  # when a scheduled rescale is due

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
        self._enter_waiting("job submitted")

    def on_resources(self, available_slots: int) -> None:
        """The slots available now (Spark: executor cores); call on every change or periodically."""
        if available_slots < 0:
            raise ValueError(f"available_slots={available_slots} must not be negative")
        self.tick()  # timers that expired before this change act first
        previous, self.available = self.available, available_slots
        now = self.clock()
        if self.state is State.WAITING_FOR_RESOURCES:
            if available_slots != previous:
                self._since = now  # stabilization restarts with every change
            self.tick()
        elif self.state is State.EXECUTING:
            target = self.desired()
            if target < self.parallelism:
                self._restart(f"resources lost: {available_slots} slots for parallelism {self.parallelism}")
            elif target > self.parallelism and available_slots > previous:
                self._new_resources(now)

    def on_failure(self, error: object) -> None:
        """A failure of the running job: the cooldown ends; wait for resources again."""
        self.tick()
        if self.state is State.EXECUTING:
            self._restart(f"failure: {error}")

    def tick(self) -> None:
        """Advance timers to the clock's now."""
        now = self.clock()
        if self.state is State.WAITING_FOR_RESOURCES:
            self._wait(now)
        elif self.state is State.EXECUTING and self._due is not None and now >= self._due:
            self._due = None
            self._rescale(now, "scheduled rescale after cooldown")
        elif self.state is State.FAILING:
            self._move(State.FINISHED, self.parallelism, "job failed")

    def finish(self) -> None:
        self._move(State.FINISHED, self.parallelism, "job finished")

    def cancel(self) -> None:
        self._move(State.CANCELING, self.parallelism, "cancel requested")
        self._move(State.FINISHED, self.parallelism, "job canceled")

    def fail(self, error: object) -> None:
        """A failure the job does not recover from (it stops): Failing, then Finished."""
        self._move(State.FAILING, self.parallelism, f"failure: {error}")
        self._move(State.FINISHED, self.parallelism, "job failed")

    # -- transitions -----------------------------------------------------------------------
    def _wait(self, now: float) -> None:
        target, waited = self.desired(), now - self._entered_waiting
        if target >= 1 and target == self.ceiling:
            self._execute(now, target, "all desired resources available")
        elif target >= 1 and now - self._since >= self.config.resource_stabilization_timeout:
            self._execute(now, target, f"resources stable for {self.config.resource_stabilization_timeout:g} s")
        elif target >= 1 and waited >= self.config.resource_wait_timeout:
            # Slots that never settle must not keep the job waiting forever (as in Flink).
            self._execute(now, target, f"resources still changing after {self.config.resource_wait_timeout:g} s")
        elif target == 0 and waited >= self.config.resource_wait_timeout:
            self._move(State.FAILING, 0, f"no resources within {self.config.resource_wait_timeout:g} s")

    def _execute(self, now: float, parallelism: int, reason: str) -> None:
        self._move(State.EXECUTING, parallelism, reason)
        self._last_rescale, self._due = now, None

    def _new_resources(self, now: float) -> None:
        since = now - self._last_rescale
        if self._due is None and since >= self.config.scaling_interval_min:
            self._rescale(now, "new resources after cooldown")
            return
        # In a cooldown (or while a rescale waits for one), new slots restart it.
        due = now + self.config.scaling_interval_min
        if self.config.scaling_interval_max is not None:
            due = min(due, self._last_rescale + self.config.scaling_interval_max)
        self._due = due
        self._record("new resources during cooldown: rescale scheduled", due)

    def _rescale(self, now: float, reason: str) -> None:
        target = self.desired()
        if target == self.parallelism:
            self._record("the scheduled rescale is no longer needed: the slots went back")
            return
        increase = target - self.parallelism
        since = now - self._last_rescale
        maximum = self.config.scaling_interval_max
        if increase >= self.config.min_parallelism_increase:
            self._change(now, target, reason)
        elif maximum is not None and since >= maximum:
            self._change(now, target, f"forced: {since:g} s since the last rescale exceeds scaling-interval.max")
        else:
            if maximum is not None:
                self._due = self._last_rescale + maximum  # look again when a forced rescale is allowed
            self._record(
                f"increase {increase} is below min-parallelism-increase {self.config.min_parallelism_increase}",
                self._due,
            )

    def _change(self, now: float, parallelism: int, reason: str) -> None:
        before = self.parallelism
        self.parallelism, self._last_rescale, self._due = parallelism, now, None
        self.events.append(Decision(now, self.state, self.available, before, parallelism, reason))

    def _restart(self, reason: str) -> None:
        self._move(State.RESTARTING, self.parallelism, reason)
        self._enter_waiting("restarted")

    def _enter_waiting(self, reason: str) -> None:
        now = self.clock()
        self._move(State.WAITING_FOR_RESOURCES, self.parallelism, reason)
        self._since = self._entered_waiting = now
        self._due = None
        self.tick()

    def _move(self, state: State, parallelism: int, reason: str) -> None:
        if self.state is State.FINISHED:
            raise ValueError(f"the job has finished; it cannot go to {state}")
        before, self.state, self.parallelism = self.parallelism, state, parallelism
        self.events.append(Decision(self.clock(), state, self.available, before, parallelism, reason))

    def _record(self, reason: str, due: float | None = None) -> None:
        """A decision that keeps the state and parallelism."""
        p = self.parallelism
        self.events.append(Decision(self.clock(), self.state, self.available, p, p, reason, due))

    def _require(self, state: State, action: str) -> None:
        if self.state is not state:
            raise ValueError(f"{action} needs state {state}, the scheduler is {self.state}")
