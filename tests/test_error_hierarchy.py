"""One error hierarchy, and one line that carries an error from Spark's workers to the driver.

Pure: the encoded line is checked inside tracebacks shaped like the ones Spark wraps
worker failures in (no JVM needed to build the text).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keyflow.errors import (
    CheckpointError,
    ConfigError,
    DamagedCheckpointError,
    DamagedFileError,
    DataError,
    EngineError,
    KeyflowError,
    NullKeysError,
    PipelineError,
    PlanError,
    RestoreError,
    WorkerError,
    decode,
    encode,
)
from keyflow.paths import unlock
from keyflow.runtime.errors import translate
from keyflow.state.checkpoint import Checkpoint

ERRORS = [
    KeyflowError("a bad value"),
    PlanError("first problem", "second problem"),
    ConfigError("parallelism.default='x' is invalid"),
    CheckpointError("checkpoint ckpt is in use by another running job"),
    DamagedFileError("state/op/0000000003.parquet", "is missing"),
    DamagedCheckpointError("checkpoint ckpt: version 3 is damaged; roll back to version 2"),
    RestoreError("checkpoint ckpt belongs to pipeline 'a', not 'b'"),
    PipelineError("process 'p' raised ZeroDivisionError: division by zero"),
    DataError("process 'p' returned columns ['a'] but its schema declares ['a', 'b']; \"quoted\"\nand a newline"),
    NullKeysError(7),
    EngineError("checkpoint ckpt is not visible from Spark's workers"),
]


def python_worker_failure(line: str) -> str:
    """What ``str()`` of a failed Spark action says when a Python worker raised (trimmed)."""
    return f"""An error occurred while calling o182.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 4.0 failed 1 times, most \
recent failure: Lost task 1.0 in stage 4.0 (TID 9) (192.168.1.5 executor driver): \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/.venv/lib/python3.11/site-packages/pyspark/worker.py", line 1247, in main
    process()
  File "/work/keyflow/runtime/workers.py", line 52, in conform
    raise WorkerError(
keyflow.errors.WorkerError: {line}

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
\tat org.apache.spark.sql.execution.python.PythonArrowOutput$$anon$1.read(PythonArrowOutput.scala:118)
Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)
Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
keyflow.errors.WorkerError: {line}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
"""


def jvm_raise_error(line: str) -> str:
    """What Spark's ``raise_error`` (null keys under 'fail') looks like on the driver (trimmed)."""
    return f"""An error occurred while calling o97.collectToPython.
: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] {line} SQLSTATE: P0001
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.raiseError(QueryExecutionErrors.scala:2736)
"""


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_every_error_survives_the_way_from_a_worker(error: KeyflowError) -> None:
    for text in (encode(error), python_worker_failure(encode(error)), jvm_raise_error(encode(error))):
        rebuilt = decode(text)
        assert type(rebuilt) is type(error)
        assert str(rebuilt) == str(error)
        assert rebuilt is not None
        assert rebuilt.fields() == error.fields()
    assert "\n" not in encode(error)  # one line, whatever the message holds


def test_the_fields_are_rebuilt() -> None:
    damaged = decode(python_worker_failure(encode(DamagedFileError("state/a.parquet", "was altered"))))
    assert isinstance(damaged, DamagedFileError)
    assert (damaged.file, damaged.problem) == ("state/a.parquet", "was altered")
    assert str(damaged) == "damaged checkpoint file state/a.parquet was altered"
    null_keys = decode(jvm_raise_error(encode(NullKeysError(12))))
    assert isinstance(null_keys, NullKeysError)
    assert null_keys.node == 12
    plan = decode(encode(PlanError("one", "two")))
    assert isinstance(plan, PlanError)
    assert plan.problems == ("one", "two")


def test_a_worker_raises_the_encoded_line() -> None:
    raised = WorkerError(DataError("key {'user': 'x'} is outside the key groups 0..63 of subtask 1"))
    assert isinstance(raised, RuntimeError)
    assert not isinstance(raised, KeyflowError)
    assert str(raised).startswith('[keyflow:DataError] {"message": "key {')


def test_translate_rebuilds_the_workers_error() -> None:
    error = DataError("process 'p' returned columns ['a'] but its schema declares ['b']")
    translated = translate(RuntimeError(python_worker_failure(encode(error))), "while running 'p'")
    assert type(translated) is DataError
    assert str(translated) == str(error)


@pytest.mark.parametrize(
    "text",
    [
        '[keyflow:NoSuchError] {"message": "x"}',  # a class this keyflow does not have
        "[keyflow:DataError] not json",
        "[keyflow:DataError] [1, 2]",
        "[keyflow] an old marker",
        "nothing of keyflow here",
    ],
)
def test_text_without_a_whole_keyflow_line_decodes_to_none(text: str) -> None:
    assert decode(text) is None


def test_without_a_keyflow_line_translate_reads_sparks_text() -> None:
    spark_failure = RuntimeError(
        "An error occurred while calling o5.count.\n: java.lang.OutOfMemoryError: heap\n\tat x"
    )
    assert type(translate(spark_failure, "while running 'p'")) is EngineError
    assert str(translate(spark_failure, "while running 'p'")) == "while running 'p': java.lang.OutOfMemoryError: heap"
    malformed = RuntimeError(
        "Encountered error while reading file file:///in/events.json. Details:\n"
        "Malformed records are detected in record parsing."
    )
    assert type(translate(malformed)) is DataError
    assert "cannot read input file file:///in/events.json (a malformed record)" in str(translate(malformed))
    user_code = RuntimeError(python_worker_failure("x").replace("keyflow.errors.WorkerError: x", "KeyError: 'k'"))
    assert type(translate(user_code)) is PipelineError
    assert str(translate(user_code)) == "a Python worker raised KeyError: 'k'"


@pytest.mark.parametrize("family", [PlanError, ConfigError, CheckpointError, PipelineError])
def test_each_family_is_a_keyflow_error(family: type[KeyflowError]) -> None:
    assert issubclass(family, KeyflowError)
    assert issubclass(family, ValueError)


def test_the_families_hold_their_kinds() -> None:
    assert issubclass(DamagedFileError, CheckpointError)
    assert issubclass(DamagedCheckpointError, CheckpointError)
    assert issubclass(RestoreError, CheckpointError)
    assert issubclass(DataError, PipelineError)
    assert issubclass(EngineError, PipelineError)
    assert issubclass(NullKeysError, DataError)
    assert not issubclass(CheckpointError, PlanError)


def test_a_held_checkpoint_lock_is_a_checkpoint_error(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "ckpt"))
    held = checkpoint.acquire()
    try:
        with pytest.raises(CheckpointError, match=r"ckpt is in use by another running job; stop it first") as raised:
            Checkpoint(str(tmp_path / "ckpt")).acquire()
        assert not isinstance(raised.value, PlanError)
    finally:
        unlock(held)
    unlock(checkpoint.acquire())  # free again
