"""``Pipeline``: the entry point users write against."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from keyflow.api import nodes
from keyflow.api.stream import Stream, check_parallelism_option
from keyflow.config import Config, load_yaml
from keyflow.errors import PlanError

if TYPE_CHECKING:
    import pyarrow as pa

    from keyflow.plan.graph import JobGraph
    from keyflow.runtime.executor import RunResult
    from keyflow.runtime.streaming import BatchMetrics, StreamingJob, StreamingResult

NodeT = TypeVar("NodeT", bound=nodes.Node)

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
            values["parallelism.default"] = check_parallelism_option(parallelism, "pipeline")
        self.config = Config(values).merged(_overrides.get())
        self.sinks: list[nodes.SinkNode] = []
        self._created = 0

    def source(self, source: Any, parallelism: int | None = None, name: str | None = None) -> Stream:
        """A stream reading ``source``; ``parallelism`` is the source's own (``scan.parallelism``)."""
        if not hasattr(source, "read"):
            raise PlanError(f"{source!r} is not a source; use datagen(...) or files(...)")
        label = name or f"source: {source.describe().get('connector', 'source')}"
        node = nodes.SourceNode((), label, check_parallelism_option(parallelism, f"source {label!r}"), source=source)
        return Stream(self, self.adopt(node))

    def adopt(self, node: NodeT) -> NodeT:
        """Give a new operator its id: its position in creation order, so the same pipeline
        code yields the same plan ids in every run (plans are persisted with state)."""
        self._created += 1
        node.uid = self._created
        return node

    def add_sink(self, sink: nodes.SinkNode) -> None:
        self.sinks.append(sink)

    def plan(self) -> JobGraph:
        """The job graph: vertices with parallelism and max parallelism, edges with partitioners."""
        from keyflow.plan.compile import compile_plan

        if not self.sinks:
            raise PlanError("the pipeline has no sink; end a stream with .sink(parquet('out/...')) or use .to_arrow()")
        return compile_plan(self.sinks, self.config)

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
        if checkpoint is None and self.config["state.checkpoints.dir"] is None and not self.is_streaming():
            from keyflow.runtime.executor import run_pipeline

            return run_pipeline(self, self.plan())
        from keyflow.runtime.streaming import run_streaming

        return run_streaming(self, self._checkpoint(checkpoint), available_now, on_batch)

    def start(
        self, checkpoint: str | None = None, on_batch: Callable[[BatchMetrics], None] | None = None
    ) -> StreamingJob:
        """Start a streaming run and return its handle (status, last batch, rescale, stop)."""
        from keyflow.runtime.streaming import StreamingJob

        return StreamingJob(self, self._checkpoint(checkpoint), False, on_batch)

    def _checkpoint(self, checkpoint: str | None) -> str:
        """The checkpoint to run with: the argument, else ``state.checkpoints.dir``."""
        checkpoint = checkpoint or self.config["state.checkpoints.dir"]
        if not self.sinks:
            self.plan()  # raises the no-sink error
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
        return any(getattr(node.source, "unbounded", False) for node in nodes.source_nodes(self.sinks))

    def collect(self, node: nodes.Node) -> pa.Table:
        from keyflow.plan.compile import compile_plan
        from keyflow.runtime.executor import collect_node

        return collect_node(self, compile_plan([node], self.config), node)
