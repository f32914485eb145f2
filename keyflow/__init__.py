"""keyflow: keyed, stateful pipelines on Apache Spark with Flink's parallelism model.

The names below load lazily, so ``import keyflow.keygroups`` stays free of Spark.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Pipeline": "keyflow.api.pipeline",
    "Stream": "keyflow.api.stream",
    "WindowedStream": "keyflow.api.stream",
    "KeyedStream": "keyflow.api.stream",
    "ConnectedStreams": "keyflow.api.stream",
    "KeyedBatch": "keyflow.state.keyed",
    "KeyedState": "keyflow.state.keyed",
    "ValueState": "keyflow.plan.descriptors",
    "ListState": "keyflow.plan.descriptors",
    "MapState": "keyflow.plan.descriptors",
    "StateTtlConfig": "keyflow.plan.descriptors",
    "datagen": "keyflow.connectors.datagen",
    "sequence": "keyflow.connectors.datagen",
    "random_int": "keyflow.connectors.datagen",
    "random_float": "keyflow.connectors.datagen",
    "random_string": "keyflow.connectors.datagen",
    "choice": "keyflow.connectors.datagen",
    "zipf": "keyflow.connectors.datagen",
    "timestamp": "keyflow.connectors.datagen",
    "files": "keyflow.connectors.files",
    "parquet": "keyflow.connectors.files",
    "json": "keyflow.connectors.files",
    "csv": "keyflow.connectors.files",
    "log": "keyflow.connectors.streams",
    "Log": "keyflow.connectors.log",
    "kafka": "keyflow.connectors.kafka.source",
    "upsert_kafka": "keyflow.connectors.kafka.source",
    "kafka_sink": "keyflow.connectors.kafka.sink",
    "upsert_kafka_sink": "keyflow.connectors.kafka.sink",
    "console": "keyflow.connectors.console",
    "blackhole": "keyflow.connectors.console",
    "nexmark": "keyflow.connectors.nexmark",
    "udf": "keyflow.plan.functions",
    "WatermarkStrategy": "keyflow.plan.event_time",
    "tumbling": "keyflow.plan.event_time",
    "sliding": "keyflow.plan.event_time",
    "cumulative": "keyflow.plan.event_time",
    "session": "keyflow.plan.event_time",
    "TimerService": "keyflow.state.timers",
    "FiredTimers": "keyflow.state.timers",
    "KeyflowError": "keyflow.errors",
    "PlanError": "keyflow.errors",
    "PipelineError": "keyflow.errors",
    "ConfigError": "keyflow.errors",
    "CheckpointError": "keyflow.errors",
    "DamagedCheckpointError": "keyflow.errors",
    "RestoreError": "keyflow.errors",
    "DataError": "keyflow.errors",
    "EngineError": "keyflow.errors",
    "ExternalSystemError": "keyflow.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'keyflow' has no attribute {name!r}")
