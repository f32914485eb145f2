"""Typed configuration: every option constant is registered once, ``get`` returns the parsed
type, and keys users give as text keep their checks (no JVM)."""

from __future__ import annotations

import pytest

import keyflow.config as config_module
from keyflow.config import (
    AUTO_PARALLELISM_ENABLED,
    AVG_DATA_VOLUME_PER_TASK,
    CHECKPOINTING_INTERVAL,
    DEFAULT_PARALLELISM,
    OPTIONS,
    PIPELINE_NAME,
    SINK_KEYED_SHUFFLE,
    Config,
    Option,
)
from keyflow.errors import ConfigError


def test_every_option_constant_is_registered_under_its_key_once() -> None:
    constants = [value for value in vars(config_module).values() if isinstance(value, Option)]
    assert sorted(option.key for option in constants) == sorted(OPTIONS)
    assert all(OPTIONS[option.key] is option for option in constants)


def test_get_returns_the_parsed_value_of_text() -> None:
    config = Config(
        {
            "parallelism.default": "4",
            "execution.checkpointing.interval": "500 ms",
            "execution.batch.adaptive.auto-parallelism.enabled": "false",
            "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "1 mb",
            "table.exec.sink.keyed-shuffle": "force",
        }
    )
    assert config.get(DEFAULT_PARALLELISM) == 4
    assert config.get(CHECKPOINTING_INTERVAL) == 0.5
    assert config.get(AUTO_PARALLELISM_ENABLED) is False
    assert config.get(AVG_DATA_VOLUME_PER_TASK) == 1 << 20
    assert config.get(SINK_KEYED_SHUFFLE) == "FORCE"


def test_unset_and_null_values_are_the_default() -> None:
    assert Config().get(PIPELINE_NAME) == "keyflow"
    assert Config({"pipeline.name": "mine"}).merged({"pipeline.name": None}).get(PIPELINE_NAME) == "keyflow"


def test_an_unknown_key_names_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown configuration key 'pipeline.max-paralelism'; did you mean "
                       r"pipeline.max-parallelism\?"):  # fmt: skip
        Config({"pipeline.max-paralelism": "8"})


# The defaults users rely on, as docs/configuration.md states them (durations in seconds).
# Flink's where the option is Flink's: 30 s / 10 s / 5 min for the adaptive scheduler, 16 MiB
# and 0.5 for batch auto-parallelism, AUTO for the sink keyed shuffle.
DEFAULTS = {
    "parallelism.default": None,
    "pipeline.max-parallelism": None,
    "pipeline.name": "keyflow",
    "pipeline.null-keys": "fail",
    "pipeline.pre-keyed.verify": "fail",
    "execution.checkpointing.interval": 1.0,
    "state.checkpoints.num-retained": 3,
    "state.compaction.max-deltas": 10,
    "jobmanager.scheduler": "default",
    "jobmanager.adaptive-scheduler.scaling-interval.min": 30.0,
    "jobmanager.adaptive-scheduler.scaling-interval.max": None,
    "jobmanager.adaptive-scheduler.min-parallelism-increase": 1,
    "jobmanager.adaptive-scheduler.resource-stabilization-timeout": 10.0,
    "jobmanager.adaptive-scheduler.resource-wait-timeout": 300.0,
    "execution.batch.adaptive.auto-parallelism.enabled": True,
    "execution.batch.adaptive.auto-parallelism.min-parallelism": 1,
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": 16 * 1024 * 1024,
    "execution.batch.adaptive.auto-parallelism.max-broadcast-ratio": 0.5,
    "table.exec.sink.keyed-shuffle": "AUTO",
    "execution.state-recovery.ignore-unclaimed-state": False,
}


def test_the_defaults_do_not_drift() -> None:
    """Typed options changed how defaults are written (durations as seconds): their values
    must stay what the docs promise."""
    options = {option.key: option for option in config_module.OPTIONS.values()}
    assert {key: options[key].default for key in DEFAULTS} == DEFAULTS
