"""Pipeline configuration: Flink-style keys, ``spark.*`` pass-through, one validation.

Sources of configuration, later ones winning: defaults, a YAML file, a dict in code,
``--conf key=value`` on the CLI. Unknown keys are errors (with the closest known key),
because a misspelt option silently ignored is a wrong result waiting to happen. A key given
no value (``key:`` in YAML, ``None`` in a dict) is its default. Code reads an option typed, by
its constant: ``config.get(MAX_PARALLELISM)``, as Flink's ``Configuration.get(ConfigOption<T>)``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import yaml

from keyflow import s3
from keyflow.errors import ConfigError
from keyflow.keygroups import UPPER_BOUND_MAX_PARALLELISM

T = TypeVar("T")


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option, as Flink's ``ConfigOption<T>``: ``parse`` turns a given value (text from YAML,
    ``--conf`` or ``SET``, or a Python value) into a T, so ``Config.get`` returns a typed value."""

    key: str
    parse: Callable[[str, Any], T]
    default: T
    doc: str


def _positive_int(key: str, value: Any, upper: int | None = None) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < 1 or (upper is not None and number > upper):
        bound = f"between 1 and {upper}" if upper else "a positive integer"
        raise ConfigError(f"{key}={value!r} is invalid; it must be {bound}")
    return number


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        if str(value) not in choices:
            raise ConfigError(f"{key}={value!r} is invalid; choose one of {', '.join(choices)}")
        return str(value)

    return parse


_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def parse_duration(key: str, value: Any, negative: bool = False) -> float:
    """Seconds from a Flink-style duration: ``30 s``, ``500 ms``, ``5 min``, ``1h`` (bare numbers: ms);
    with ``negative``, ``-1 s`` and the like are allowed (they mean "no timeout" where Flink says so)."""
    text = str(value).strip()
    if text.startswith("-"):
        if not negative:
            raise ConfigError(f"{key}={value!r} must not be negative")
        return -parse_duration(key, text[1:])
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(value).lower())
    if isinstance(value, bool) or not match or match.group(2) not in (*_UNITS, ""):
        raise ConfigError(f"{key}={value!r} is not a duration; write e.g. '30 s', '500 ms' or '5 min'")
    return float(match.group(1)) * _UNITS.get(match.group(2), 0.001)


def _flag(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{key}={value!r} is invalid; use true or false")
    return text == "true"


_SIZE_UNITS = {"": 1, "b": 1, "bytes": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
               "tib": 1 << 40}  # fmt: skip


def parse_size(key: str, value: Any) -> int:
    """Bytes from a Flink ``MemorySize``: ``64mb``, ``16 MiB``, ``1g``; units are binary (as
    Flink's: ``1 mb`` is 1024 x 1024 bytes); a bare number is bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(value).lower())
    if isinstance(value, bool) or not match or match.group(2) not in _SIZE_UNITS or int(match.group(1)) < 1:
        raise ConfigError(f"{key}={value!r} is not a positive size; write e.g. '16mb', '512 kb' or '1 gb'")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _ratio(key: str, value: Any) -> float:
    try:
        number = float(str(value))
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not 0 <= number < 1:
        raise ConfigError(f"{key}={value!r} is invalid; it must be a number in [0, 1), e.g. 0.5")
    return number


def _text(key: str, value: Any) -> str:
    if not str(value).strip():
        raise ConfigError(f"{key} must not be empty")
    return str(value)


AUTO_PARALLELISM = "execution.batch.adaptive.auto-parallelism."
_SCHEDULER = "jobmanager.adaptive-scheduler."


def auto_parallelism_bounds(low: int, high: int) -> str:
    """The error for a lower bound of auto-parallelism above its upper bound."""
    return (
        f"min-parallelism={low} must be between 1 and max-parallelism={high}; lower min-parallelism or raise "
        "max-parallelism"
    )


def _key_groups(key: str, value: Any) -> int:
    return _positive_int(key, value, UPPER_BOUND_MAX_PARALLELISM)


# Pipeline options
DEFAULT_PARALLELISM: Option[int | None] = Option(
    "parallelism.default",
    _positive_int,
    None,
    "Parallelism of every operator that sets none. Default: the cores of a local[N]/local[*] master, "
    "else spark.default.parallelism.",
)
MAX_PARALLELISM: Option[int | None] = Option(
    "pipeline.max-parallelism",
    _key_groups,
    None,
    "Number of key groups K (1..32768). Default: the keyflow policy (27720 up to parallelism 1024).",
)
PIPELINE_NAME: Option[str] = Option("pipeline.name", _text, "keyflow", "Name of the pipeline (Spark application name).")
NULL_KEYS: Option[str] = Option(
    "pipeline.null-keys",
    _choice("fail", "drop"),
    "fail",
    "What key_by does with rows whose key has a null: fail (error with the count) or drop. "
    "A dead-letter sink passed to key_by(on_null=...) overrides this.",
)
PRE_KEYED_VERIFY: Option[str] = Option(
    "pipeline.pre-keyed.verify",
    _choice("fail", "warn", "off"),
    "fail",
    "Streams reinterpreted as keyed (reinterpret_as_keyed): fail stops the job when a row's key group "
    "is not its subtask's, or a key of a pre-keyed source is in two splits, before the batch commits; "
    "warn counts and logs keys in two splits and goes on; off checks nothing.",
)
PROGRESS: Option[str] = Option(
    "pipeline.progress",
    _choice("auto", "on", "off"),
    "auto",
    "Progress display while Spark jobs run: auto (only on a terminal), on, off.",
)

# Streaming options
CHECKPOINTING_INTERVAL: Option[float] = Option(
    "execution.checkpointing.interval",
    parse_duration,
    1.0,
    "Streaming: how often a micro-batch starts (each micro-batch is one checkpoint), e.g. '1 s', '0 s'.",
)
CHECKPOINTS_DIRECTORY: Option[str | None] = Option(
    "state.checkpoints.dir", _text, None, "Streaming: checkpoint directory when run() is given none."
)
CHECKPOINTS_NUM_RETAINED: Option[int] = Option(
    "state.checkpoints.num-retained",
    _positive_int,
    3,
    "Streaming: how many committed checkpoints to keep; older ones and files only they use are deleted.",
)
COMPACTION_MAX_DELTAS: Option[int] = Option(
    "state.compaction.max-deltas",
    _positive_int,
    10,
    "Streaming: a subtask rewrites its key-group range as one full file once that many delta files "
    "would be read to restore it (bounds restore cost).",
)


def _endpoint(key: str, value: Any) -> str:
    text = _text(key, value).strip()
    try:
        s3.split_endpoint(text)
    except ValueError:
        raise ConfigError(
            f"{key}={value!r} is not an endpoint; write host[:port] (https) or http(s)://host[:port], "
            "e.g. http://127.0.0.1:9000"
        ) from None
    return text


def _retries(key: str, value: Any) -> int:
    return 0 if str(value).strip() == "0" else _positive_int(key, value)


def _timeout(key: str, value: Any) -> float:
    seconds = parse_duration(key, value)
    if seconds <= 0:
        raise ConfigError(f"{key}={value!r} must be above 0; write e.g. '30 s'")
    return seconds


# S3-compatible storage (checkpoints on s3://...): Flink's keys, which its S3 filesystems pass to
# Hadoop's fs.s3a.* options of the same meaning.
S3_ENDPOINT: Option[str | None] = Option(
    "s3.endpoint", _endpoint, None,
    "Endpoint of an S3-compatible store (MinIO, Ceph, a local server): host[:port] (https) or "
    "http(s)://host[:port]. Default: AWS, or the AWS_ENDPOINT_URL environment variable.",
)  # fmt: skip
S3_REGION: Option[str | None] = Option(
    "s3.endpoint.region", _text, None, "Region of the store. Default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1."
)
S3_ACCESS_KEY: Option[str | None] = Option(
    "s3.access-key", _text, None,
    "Access key id (with s3.secret-key). Default: the AWS SDK's chain (AWS_ACCESS_KEY_ID, profile, instance role).",
)  # fmt: skip
S3_SECRET_KEY: Option[str | None] = Option("s3.secret-key", _text, None, "Secret key (with s3.access-key).")
S3_RETRIES: Option[int] = Option(
    "s3.attempts.maximum", _retries, s3.DEFAULT_RETRIES,
    "Retries of a failed request after its first try (as Hadoop's fs.s3a.attempts.maximum): throttling, 5xx, "
    "connection errors and timeouts are retried with exponential backoff and jitter (the AWS SDK's standard "
    "strategy); then the micro-batch fails, nothing of it committed, and a restart resumes it.",
)  # fmt: skip
S3_CONNECT_TIMEOUT: Option[float] = Option(
    "s3.connection.establish.timeout", _timeout, s3.DEFAULT_CONNECT_TIMEOUT,
    "How long to wait for a connection to the store (bare numbers: ms, as Hadoop's).",
)  # fmt: skip
S3_REQUEST_TIMEOUT: Option[float] = Option(
    "s3.connection.timeout", _timeout, s3.DEFAULT_REQUEST_TIMEOUT,
    "A request that receives no data for this long fails its try and is retried (bare numbers: ms). Hadoop's "
    "default is 200 s; keyflow's 60 s, so a stalled store fails a micro-batch sooner.",
)  # fmt: skip


IGNORE_UNCLAIMED_STATE: Option[bool] = Option(
    "execution.state-recovery.ignore-unclaimed-state",
    _flag,
    False,
    "Streaming: restore a checkpoint even if it holds state of operators the pipeline no longer has "
    "(that state is dropped).",
)

# Adaptive scheduler options (streaming)
SCHEDULER: Option[str] = Option(
    "jobmanager.scheduler",
    _choice("default", "adaptive"),
    "default",
    "Streaming: adaptive follows the executor cores Spark has (parallelism = min(cores, "
    "parallelism.default if set, max parallelism)) with the cooldown below; default keeps the "
    "parallelism fixed.",
)
SCALING_INTERVAL_MIN: Option[float] = Option(
    _SCHEDULER + "scaling-interval.min",
    parse_duration,
    30.0,
    "Adaptive scheduler: the cooldown after a rescale (Flink 1.19/1.20). New slots more than this long "
    "after the last rescale rescale at once; earlier ones are checked when the cooldown ends.",
)
SCALING_INTERVAL_MAX: Option[float | None] = Option(
    _SCHEDULER + "scaling-interval.max",
    parse_duration,
    None,
    "Adaptive scheduler: every rescale check that rescales nothing schedules a forced-rescale check this "
    "long after it; an increase below min-parallelism-increase is forced by the first that finds it (at "
    "once if the last rescale is longer ago). Unset: never forced. Must be greater than scaling-interval.min.",
)
MIN_PARALLELISM_INCREASE: Option[int] = Option(
    _SCHEDULER + "min-parallelism-increase",
    _positive_int,
    1,
    "Adaptive scheduler: smallest parallelism increase worth a rescale.",
)
RESOURCE_STABILIZATION_TIMEOUT: Option[float] = Option(
    _SCHEDULER + "resource-stabilization-timeout",
    parse_duration,
    10.0,
    "Adaptive scheduler: at start, after lost resources or a failure, how long to wait once sufficient "
    "(not all desired) slots are there before the job runs at what is there; set once, not moved by "
    "later changes. Alias: …submission.resource-stabilization-timeout (Flink 2's name).",
)
RESOURCE_WAIT_TIMEOUT: Option[float] = Option(
    _SCHEDULER + "resource-wait-timeout",
    lambda key, value: parse_duration(key, value, negative=True),
    300.0,
    "Adaptive scheduler: how long to wait for resources; then the job runs at what is there, or fails "
    "with no slot. Negative (e.g. -1 s): wait forever. Alias: …submission.resource-wait-timeout.",
)

# Batch options: auto-parallelism (Flink's adaptive batch scheduler)
AUTO_PARALLELISM_ENABLED: Option[bool] = Option(
    AUTO_PARALLELISM + "enabled",
    _flag,
    True,
    "Batch: each keyed operator without an explicit parallelism gets one decided from the bytes of its "
    "input once that is written to the shuffle (Flink's adaptive batch scheduler, FLIP-187).",
)
AUTO_PARALLELISM_MIN: Option[int] = Option(
    AUTO_PARALLELISM + "min-parallelism",
    _positive_int,
    1,
    "Batch auto-parallelism: the lower bound of a decided parallelism.",
)
AUTO_PARALLELISM_MAX: Option[int | None] = Option(
    AUTO_PARALLELISM + "max-parallelism",
    _key_groups,
    None,
    "Batch auto-parallelism: the upper bound of a decided parallelism. Default: parallelism.default if "
    "set (as Flink), else the task slots Spark has; never above the max parallelism K.",
)
AVG_DATA_VOLUME_PER_TASK: Option[int] = Option(
    AUTO_PARALLELISM + "avg-data-volume-per-task",
    parse_size,
    16 * 1024 * 1024,
    "Batch auto-parallelism: the bytes each subtask should read ('16mb'; binary units, as Flink's).",
)
DEFAULT_SOURCE_PARALLELISM: Option[int | None] = Option(
    AUTO_PARALLELISM + "default-source-parallelism",
    _positive_int,
    None,
    "Batch auto-parallelism: the parallelism of sources that set none. Default: unset, sources read at "
    "their usual parallelism (Flink's default is 1).",
)
MAX_BROADCAST_RATIO: Option[float] = Option(
    AUTO_PARALLELISM + "max-broadcast-ratio",
    _ratio,
    0.5,
    "Batch auto-parallelism (keyflow's; Flink 1.15/1.16 fix it at 0.5, 1.17+ ignore broadcast bytes): "
    "broadcast input counts in the formula up to this fraction of avg-data-volume-per-task.",
)
AUTO_PARALLELISM_BALANCE: Option[str] = Option(
    AUTO_PARALLELISM + "balance",
    _choice("bytes", "even"),
    "bytes",
    "Batch auto-parallelism (keyflow's): bytes gives each subtask a contiguous key-group range balanced by "
    "the measured bytes; even splits the key groups evenly as FLIP-187 does.",
)

# SQL options
SINK_KEYED_SHUFFLE: Option[str] = Option(
    "table.exec.sink.keyed-shuffle",
    lambda key, value: _choice("AUTO", "FORCE", "NONE")(key, str(value).upper()),
    "AUTO",
    "SQL sinks with a primary key: AUTO routes rows to the sink by the key's key group when the sink's "
    "parallelism differs from its input's; FORCE whenever the sink's parallelism is not 1; NONE never.",
)
STATE_TTL: Option[float] = Option(
    "table.exec.state.ttl",
    parse_duration,
    0.0,
    "Idle state retention of regular joins, per key: a key none of whose rows has arrived for this long "
    "(processing time) loses the rows of both inputs. 0: kept forever (Flink's default). Not yet applied to "
    "other operators.",
)

# Every option by key, in the order the unknown-key error lists them.
OPTIONS: dict[str, Option[Any]] = {
    option.key: option
    for option in (
        DEFAULT_PARALLELISM,
        MAX_PARALLELISM,
        PIPELINE_NAME,
        NULL_KEYS,
        PRE_KEYED_VERIFY,
        PROGRESS,
        CHECKPOINTING_INTERVAL,
        CHECKPOINTS_DIRECTORY,
        CHECKPOINTS_NUM_RETAINED,
        COMPACTION_MAX_DELTAS,
        SCHEDULER,
        SCALING_INTERVAL_MIN,
        SCALING_INTERVAL_MAX,
        MIN_PARALLELISM_INCREASE,
        RESOURCE_STABILIZATION_TIMEOUT,
        RESOURCE_WAIT_TIMEOUT,
        AUTO_PARALLELISM_ENABLED,
        AUTO_PARALLELISM_MIN,
        AUTO_PARALLELISM_MAX,
        AVG_DATA_VOLUME_PER_TASK,
        DEFAULT_SOURCE_PARALLELISM,
        MAX_BROADCAST_RATIO,
        AUTO_PARALLELISM_BALANCE,
        SINK_KEYED_SHUFFLE,
        STATE_TTL,
        IGNORE_UNCLAIMED_STATE,
        S3_ENDPOINT,
        S3_REGION,
        S3_ACCESS_KEY,
        S3_SECRET_KEY,
        S3_RETRIES,
        S3_CONNECT_TIMEOUT,
        S3_REQUEST_TIMEOUT,
    )
}


# Flink 2's names for the same options: FLIP-472 renamed the submission timeouts without
# changing what they mean (FLINK-36015's release note).
ALIASES = {
    _SCHEDULER + "submission.resource-stabilization-timeout": _SCHEDULER + "resource-stabilization-timeout",
    _SCHEDULER + "submission.resource-wait-timeout": _SCHEDULER + "resource-wait-timeout",
}

_FLINK_1 = "keyflow's adaptive scheduler is Flink 1.19/1.20's (FLIP-160 with FLIP-322's cooldown)"
FLINK_2_ONLY = {
    _SCHEDULER + "executing.cooldown-after-rescaling": (
        "in Flink 2 it is the cooldown of another state machine (Cooldown -> Idling/Stabilizing -> Stabilized, "
        f"rescaling on a completed checkpoint); {_FLINK_1}: use {_SCHEDULER}scaling-interval.min"
    ),
    _SCHEDULER + "executing.resource-stabilization-timeout": (
        "in Flink 2 it is how long a running job waits for changed resources to stabilize before it rescales "
        f"(default 60 s); {_FLINK_1}, which rescales after {_SCHEDULER}scaling-interval.min and forces small "
        f"increases after {_SCHEDULER}scaling-interval.max: use those"
    ),
    _SCHEDULER + "rescale-trigger.max-delay": (
        "in Flink 2 (FLIP-461) a rescale waits for a completed checkpoint, at most this long; keyflow rescales at "
        "the next micro-batch boundary, which is its checkpoint: remove it"
    ),
    _SCHEDULER + "rescale-trigger.max-checkpoint-failures": (
        "in Flink 2 (FLIP-461) a rescale waits for a completed checkpoint unless this many fail; keyflow rescales "
        "at the next micro-batch boundary, which is its checkpoint: remove it"
    ),
}
FLINK_2_ONLY[_SCHEDULER + "max-delay-for-scale-trigger"] = FLINK_2_ONLY[_SCHEDULER + "rescale-trigger.max-delay"]
FLINK_2_ONLY[_SCHEDULER + "scale-on-failed-checkpoints-count"] = FLINK_2_ONLY[
    _SCHEDULER + "rescale-trigger.max-checkpoint-failures"
]


class Config:
    """Validated keyflow options, read typed with ``get(OPTION)``, plus raw ``spark.*`` settings."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = {key: option.default for key, option in OPTIONS.items()}
        self._spark: dict[str, str] = {}
        self.update(values or {})

    def update(self, values: Mapping[str, Any]) -> None:
        names = [ALIASES.get(str(key).strip(), str(key).strip()) for key in values]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            given = [str(key) for key in values if ALIASES.get(str(key).strip(), str(key).strip()) in twice]
            raise ConfigError(f"{' and '.join(given)} are one option (Flink's old and new names); give one of them")
        for key, value in values.items():
            key = str(key).strip()
            if key.startswith("spark."):
                self._spark[key] = str(value)
            elif key in FLINK_2_ONLY:
                raise ConfigError(f"{key} is not supported: {FLINK_2_ONLY[key]}")
            elif key in OPTIONS or key in ALIASES:
                canonical = ALIASES.get(key, key)
                option = OPTIONS[canonical]
                self._values[canonical] = option.default if value is None else option.parse(key, value)
            else:
                raise ConfigError(unknown_key_message(key))

    def merged(self, values: Mapping[str, Any] | None) -> Config:
        """A copy with ``values`` applied on top."""
        copy = Config()
        copy._values, copy._spark = dict(self._values), dict(self._spark)
        copy.update(values or {})
        return copy

    @property
    def spark(self) -> dict[str, str]:
        return dict(self._spark)

    def get(self, option: Option[T]) -> T:
        """The option's value: as its ``parse`` returned it when set, else its default."""
        return cast(T, self._values[option.key])

    def s3_settings(self) -> s3.S3Settings | None:
        """The store's settings if any ``s3.*`` option is set, else None (the environment's)."""
        options: tuple[Option[Any], ...] = (S3_ENDPOINT, S3_REGION, S3_ACCESS_KEY, S3_SECRET_KEY, S3_RETRIES,
                                            S3_CONNECT_TIMEOUT, S3_REQUEST_TIMEOUT)  # fmt: skip
        if all(self.get(option) == option.default for option in options):
            return None
        if (self.get(S3_ACCESS_KEY) is None) != (self.get(S3_SECRET_KEY) is None):
            given, missing = (S3_ACCESS_KEY, S3_SECRET_KEY) if self.get(S3_SECRET_KEY) is None else (
                S3_SECRET_KEY, S3_ACCESS_KEY)  # fmt: skip
            raise ConfigError(
                f"{given.key} is set but {missing.key} is not; give both, or neither (the AWS SDK's chain)"
            )
        return s3.S3Settings(
            self.get(S3_ENDPOINT), self.get(S3_REGION), self.get(S3_ACCESS_KEY), self.get(S3_SECRET_KEY),
            self.get(S3_RETRIES), self.get(S3_CONNECT_TIMEOUT), self.get(S3_REQUEST_TIMEOUT),
        )  # fmt: skip

    def default_parallelism(self) -> int:
        """``parallelism.default``, or the local master's cores, or ``spark.default.parallelism``."""
        configured = self.get(DEFAULT_PARALLELISM)
        if configured is not None:
            return configured
        master = self._spark.get("spark.master", "local[*]")
        match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
        if match:
            cores = match.group(1)
            return (os.cpu_count() or 1) if cores in (None, "*") else int(cores)
        if "spark.default.parallelism" in self._spark:
            return _positive_int("spark.default.parallelism", self._spark["spark.default.parallelism"])
        if self.get(SCHEDULER) == "adaptive":
            return 1  # until the adaptive scheduler, at start, sets it from the executor cores
        raise ConfigError(
            f"parallelism.default is not set and spark.master={master} is not local; "
            "set parallelism.default (e.g. --conf parallelism.default=8)"
        )


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML file of ``key: value`` pairs (nested mappings are joined with dots)."""
    file = Path(path)
    try:
        loaded = yaml.safe_load(file.read_text()) or {}
    except OSError as error:
        raise ConfigError(f"cannot read config file {file}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {file} is not valid YAML: {error}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {file} must be a mapping of key: value, got {type(loaded).__name__}")
    return _flatten(loaded)


def parse_conf_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` from ``--conf`` flags."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf {pair!r} is not key=value, e.g. --conf parallelism.default=4")
        parsed[key.strip()] = value.strip()
    return parsed


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, list(OPTIONS), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"unknown configuration key {key!r}; {hint}known keys: {', '.join(OPTIONS)}, and spark.* keys"
