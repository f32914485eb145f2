"""``Pipeline``: the entry point users write against. Its plan builder (``keyflow.plan``)
collects and checks the plan nodes, also those SQL adds; the compiled plan goes to the runtime."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyflow.api.stream import Stream
from keyflow.config import CHECKPOINTS_DIRECTORY, Config, load_yaml
from keyflow.errors import PlanError
from keyflow.plan import nodes
from keyflow.plan.builder import PlanBuilder, check_parallelism
from keyflow.plan.compile import CompiledPlan
from keyflow.plan.event_time import WatermarkStrategy
from keyflow.plan.functions import scalar_function
from keyflow.plan.graph import JobGraph

if TYPE_CHECKING:
    import pyarrow as pa

    from keyflow.runtime.executor import RunResult
    from keyflow.runtime.streaming import BatchMetrics, StreamingJob, StreamingResult

_overrides: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("keyflow_overrides", default=None)


@contextmanager
def config_overrides(values: Mapping[str, Any]) -> Iterator[None]:
    """Configuration that wins over what a pipeline file sets (the CLI's ``--conf``)."""
    token = _overrides.set(dict(values))
    try:
        yield
    finally:
        _overrides.reset(token)


class Pipeline:
    """A dataflow of sources, operators and sinks, run on Spark.

    ``config`` is a mapping or a YAML file path of options (see docs/configuration.md);
    ``parallelism`` is shorthand for ``parallelism.default``.
    """

    def __init__(self, parallelism: int | None = None, config: Mapping[str, Any] | str | Path | None = None) -> None:
        values = load_yaml(config) if isinstance(config, (str, Path)) else dict(config or {})
        if parallelism is not None:
            values["parallelism.default"] = check_parallelism(parallelism, "pipeline")
        self.builder = PlanBuilder(Config(values), _overrides.get())

    @property
    def config(self) -> Config:
        return self.builder.config

    def source(
        self,
        source: Any,
        parallelism: int | None = None,
        name: str | None = None,
        uid: str | None = None,
        watermark: WatermarkStrategy | None = None,
    ) -> Stream:
        """A stream reading ``source``; ``parallelism`` is the source's own (``scan.parallelism``);
        ``watermark`` (Flink's ``fromSource(source, watermarkStrategy, name)``) declares its event
        time and how the watermark follows it, per split: see docs/event_time.md."""
        return Stream(self, self.builder.source(source, parallelism, name, uid, watermark))

    @property
    def operators(self) -> Mapping[int, nodes.Node]:
        """Every operator added so far, by id."""
        return self.builder.operators

    def set_option(self, key: str, value: Any) -> None:
        """Set one configuration option (SQL's ``SET``); ``--conf`` given to the CLI still wins."""
        self.builder.set_option(key, value)

    def sql(self, text: str) -> Stream | None:
        """Run SQL statements on this pipeline (see docs/sql.md): ``CREATE TABLE`` declares
        tables, ``INSERT INTO`` adds sinks, ``SET`` sets options, ``EXPLAIN`` prints a plan.
        A final bare ``SELECT`` returns its stream, to go on with the Python API."""
        from keyflow.sql.planner import plan_script

        planned = plan_script(self.builder, text)
        for explained in planned.explained:
            print(explained)
        return None if planned.query is None else Stream(self, planned.query)

    def register_function(self, name: str, function: Callable[..., Any], result_type: str | None = None) -> None:
        """Make ``function`` callable by ``name`` in this pipeline's SQL and expressions
        (Flink's ``createTemporarySystemFunction``): vectorised, it receives one pandas Series
        per argument and returns a Series of ``result_type`` (a Spark SQL type, or the one
        ``@keyflow.udf`` declared)."""
        self.builder.register_function(scalar_function(name, function, result_type))

    def create_temporary_view(self, name: str, stream: Stream) -> None:
        """Make ``stream`` readable in SQL as ``FROM name``."""
        from keyflow.sql.catalog import catalog_of

        catalog_of(self.builder).create_view(name, stream.node_id)

    def compile(self) -> CompiledPlan:
        """What runs: every sink and what it depends on, compiled."""
        return self.builder.compile()

    def plan(self) -> JobGraph:
        """The job graph: vertices with parallelism and max parallelism, edges with partitioners.

        Without sinks (streams only collected with ``to_arrow``/``to_pandas``), the plan of
        every stream nothing else reads."""
        return self.builder.plan()

    def run(
        self,
        checkpoint: str | None = None,
        available_now: bool = False,
        on_batch: Callable[[BatchMetrics], None] | None = None,
    ) -> RunResult | StreamingResult:
        """Run every sink. Bounded sources: one batch job. An unbounded source: a streaming
        job with exactly-once state and sinks in ``checkpoint`` (or ``state.checkpoints.dir``)
        that runs until interrupted, or with ``available_now`` until the data there now is done;
        ``on_batch`` is called with each committed micro-batch's metrics."""
        plan = self.compile()
        if checkpoint is None and self.config.get(CHECKPOINTS_DIRECTORY) is None and not self.is_streaming():
            from keyflow.runtime.executor import run_batch

            return run_batch(plan)
        from keyflow.runtime.streaming import run_streaming

        return run_streaming(plan, self._checkpoint(checkpoint), available_now, on_batch)

    def start(
        self, checkpoint: str | None = None, on_batch: Callable[[BatchMetrics], None] | None = None
    ) -> StreamingJob:
        """Start a streaming run and return its handle (status, last batch, rescale, stop)."""
        from keyflow.runtime.streaming import StreamingJob

        plan = self.compile()
        return StreamingJob(plan, self._checkpoint(checkpoint), False, on_batch)

    def _checkpoint(self, checkpoint: str | None) -> str:
        """The checkpoint to run with: the argument, else ``state.checkpoints.dir``."""
        checkpoint = checkpoint or self.config.get(CHECKPOINTS_DIRECTORY)
        if checkpoint is None:
            raise PlanError(
                "this pipeline reads an unbounded source, so it needs a checkpoint directory: "
                "run(checkpoint='ckpt/my-pipeline') or --checkpoint DIR or state.checkpoints.dir"
            )
        if not isinstance(checkpoint, str) or not checkpoint.strip():
            raise PlanError(f"checkpoint={checkpoint!r} is not a directory path or URI")
        return str(checkpoint)

    def is_streaming(self) -> bool:
        """Whether the pipeline reads an unbounded source (so it runs as a stream)."""
        return self.builder.reads_unbounded()

    def collect(self, node_id: int) -> pa.Table:
        """Run the plan up to the operator ``node_id`` and return its rows."""
        from keyflow.runtime.executor import collect

        return collect(self.builder.compile((node_id,)))
